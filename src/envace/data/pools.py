"""Which tasks a run uses: which training tasks the warm start is supervised on and which RL rolls
out (all of them, or two disjoint pools of scenarios), and an even spread of a capped held-out set.

A warm start supervised on the gold of the very tasks RL then samples has memorised them: most GRPO
groups are all-success (no reward variance, no gradient), and what the few others teach is what the
warm start already fits (docs/training.md, "Why RL lowered success"). With ``rl_share`` a stable
share of the training families (the categories of one BFCL scenario together, any other task alone:
they share a first turn) is RL's only, the rest the warm start's only: a function of the families'
names, so every unit of a grid, whatever its seed or machine, draws the same two pools.
"""

from __future__ import annotations

import zlib

from envace.data.sources.bfcl import scenario_of
from envace.types import Task


def family_of(task_id: str) -> str:
    """A task's family: its BFCL scenario (``multi_turn_59``, shared by the scenario's categories) or,
    for any other task, its id. The one rule for what counts as one unit, in training's pools and in
    the report's intervals (:func:`envace.experiment.hypotheses.families`).

    >>> family_of("multi_turn_miss_param_59"), family_of("simple_python_3")
    ('multi_turn_59', 'simple_python_3')
    """
    return scenario_of(task_id) or task_id


def rl_families(families: set[str], share: float) -> set[str]:
    """The families of RL's pool: ``round(share * families)`` of them, those first in the order of the
    CRC-32 of their names (a pseudo-random order every machine agrees on), at least one, and never all.
    """
    ordered = sorted(families, key=lambda f: (zlib.crc32(f.encode()), f))
    return set(ordered[: min(max(1, round(share * len(ordered))), len(ordered) - 1)])


def split_pool(tasks: list[Task], rl_share: float) -> tuple[list[Task], list[Task]]:
    """``(the warm start's tasks, RL's tasks)``: both all of ``tasks`` at ``rl_share`` 0, else the
    families outside and inside :func:`rl_families`, each in source order.

    >>> tasks = [Task(f"multi_turn_{c}_{i}", "x") for i in range(40) for c in ("base", "long_context")]
    >>> grounded, rl = split_pool(tasks, 0.25)
    >>> len(grounded), len(rl), {family_of(t.id) for t in grounded} & {family_of(t.id) for t in rl}
    (60, 20, set())
    """
    if not 0.0 <= rl_share < 1.0:
        raise ValueError(f"rl_share must be a fraction in [0, 1), got {rl_share}")
    if rl_share == 0.0:
        return list(tasks), list(tasks)
    names = [family_of(t.id) for t in tasks]
    if len(set(names)) < 2:
        raise ValueError(f"rl_share {rl_share}: the training tasks hold fewer than two families to split")
    pool = rl_families(set(names), rl_share)
    rl = [f in pool for f in names]
    return [t for t, r in zip(tasks, rl, strict=True) if not r], [t for t, r in zip(tasks, rl, strict=True) if r]


def spread(items: list[Task], count: int) -> list[Task]:
    """``count`` items evenly spaced over ``items``, in order (all of them when there are fewer).

    >>> [t.id for t in spread([Task(str(i), "x") for i in range(10)], 4)]
    ['0', '2', '5', '7']
    """
    n = len(items)
    if count >= n:
        return list(items)
    return [items[(i * n) // count] for i in range(count)]
