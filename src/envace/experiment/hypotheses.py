"""What every number of a report rests on: task families, the bootstrap settings, the formats, and the
per-task values a hypothesis compares (:mod:`~envace.experiment.judge` judges the declared ones).

Success is the official checker's, with no rehearsal (setting ``none``), pooled over the grid's
splits; differences are paired by task. Gains of a rehearsal setting over ``none`` are paired on
task × seed cells: with ``evaluation.rehearsal_seeds``, ``none`` on the seeds the setting was
evaluated on. Gold-call fidelity is compared in one gold layout that every evaluation compared holds
(:func:`common_layout`, ``call`` first), never two layouts mixed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from envace.data.pools import family_of
from envace.experiment.results import (
    NONE,
    Eval,
    Item,
    PerTask,
    Results,
    evals_of,
    fidelity_values,
    item_values,
    paired_item_values,
)
from envace.experiment.stats import cluster_bootstrap, paired_difference

Interval = tuple[float, float, float]
Diff = tuple[float, float, float, int]


def families(keys: Iterable[str]) -> dict[str, str]:
    """The family of each task key (``split/task_id``): ``split/scenario`` for the categories of one
    BFCL multi-turn scenario (:func:`~envace.data.pools.family_of`), the key itself otherwise.

    >>> sorted(set(families(["val/multi_turn_base_59", "val/multi_turn_miss_func_59", "test/t1"]).values()))
    ['test/t1', 'val/multi_turn_59']
    """
    out = {}
    for key in keys:
        split, _, task = key.rpartition("/")
        out[key] = f"{split}/{family_of(task)}" if split else family_of(task)
    return out


def family_count(keys: Iterable[str]) -> int:
    """How many families (:func:`families`) the task keys fall in."""
    return len(set(families(keys).values()))


@dataclass(frozen=True)
class Boot:
    """Bootstrap settings shared by every number of one report; methods return ``None`` when there is no data.

    Every interval resamples task families (:func:`families`), so tasks that share a scenario count once.

    Args:
        n_boot: replicates per interval.
        seed: generator seed of every interval (each call starts a fresh generator).
    """

    n_boot: int = 2000
    seed: int = 0

    def mean(self, values: dict[str, list[float]]) -> Interval | None:
        return cluster_bootstrap(values, self.n_boot, self.seed, families=families(values)) if values else None

    def diff(self, a: dict[str, list[float]], b: dict[str, list[float]]) -> Diff | None:
        if not set(a) & set(b):
            return None
        return paired_difference(a, b, self.n_boot, self.seed, families=families(set(a) & set(b)))


def fmt(x: float) -> str:
    """A number with 3 decimals, never ``-0.000``.

    >>> fmt(-1e-9), fmt(0.12345)
    ('0.000', '0.123')
    """
    return f"{round(x, 3) + 0.0:.3f}"


def format_interval(value: Interval | Diff | None) -> str:
    """``mean [lo, hi]`` with 3 decimals, ``—`` without data.

    >>> format_interval((0.5, 0.25, 0.75)), format_interval(None)
    ('0.500 [0.250, 0.750]', '—')
    """
    return "—" if value is None else f"{fmt(value[0])} [{fmt(value[1])}, {fmt(value[2])}]"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table.

    >>> markdown_table(["a", "b"], [["1", "2"]])
    ['| a | b |', '|---|---|', '| 1 | 2 |']
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def limit_shares(items: list[Item]) -> str:
    """``committed k/n · imagined k/m``: attempts a rollout limit ended, of those whose flags are recorded.

    >>> limit_shares([Item("val", "a", "p@2", 2, "p", True, 1.0, 1.0, flags=("truncated",),
    ...                    imagined_flags=((), ("max_steps",)))])
    'committed 1/1 · imagined 1/2'
    """
    committed = [bool(it.flags) for it in items if it.flags is not None]
    imagined = [bool(a) for it in items if it.imagined_flags is not None for a in it.imagined_flags]
    if not committed and not imagined:
        return "—"
    parts = [f"committed {sum(committed)}/{len(committed)}"] if committed else []
    return " · ".join(parts + ([f"imagined {sum(imagined)}/{len(imagined)}"] if imagined else []))


def success(results: Results, arm: str, setting: str = NONE) -> dict[str, list[float]]:
    """Per-task official success of an arm (or the warm start), pooled over the grid's splits."""
    return item_values(results, arm, "success", results.experiment.splits, setting)


def rehearsal_success(results: Results, arm: str, setting: str) -> tuple[PerTask, PerTask]:
    """:func:`success` with ``setting`` and with ``none`` on the task × seed cells both have: a setting
    evaluated on some seeds only (``evaluation.rehearsal_seeds``) against ``none`` on those seeds."""
    return paired_item_values(results, arm, "success", results.experiment.splits, setting, NONE)


def gain(results: Results, arm: str, setting: str, boot: Boot) -> Diff | None:
    """The gain of pooled success with ``setting`` over ``none``, paired on task × seed cells."""
    return boot.diff(*rehearsal_success(results, arm, setting))


def best_gain(results: Results, arm: str, boot: Boot) -> tuple[str, Diff] | None:
    """The rehearsal setting with the largest mean gain of pooled success over ``none`` for an arm, and its gain.

    Each gain is paired on the task × seed cells the setting has (:func:`gain`). Ties go to the setting
    listed first in the grid; ``None`` when no setting other than ``none`` has data.
    """
    best: tuple[str, Diff] | None = None
    for setting in results.experiment.settings:
        diff = gain(results, arm, setting, boot) if setting != NONE else None
        if diff is not None and (best is None or diff[0] > best[1][0]):
            best = (setting, diff)
    return best


#: the gold layouts a fidelity comparison prefers, best first (``call``: as training episodes are laid out)
LAYOUTS = ("call", "turn")


def common_layout(evals: Iterable[Eval]) -> str | None:
    """The gold layout that every evaluation with gold fidelity holds, :data:`LAYOUTS` first (then by
    name); ``None`` when they share none. An evaluation without fidelity rows constrains nothing, so
    evaluations without any give ``call``, with nothing to read.

    >>> from envace.experiment.results import Fidelity
    >>> def ev(*layouts): return Eval("p", "a", 0, 1.0, [], [Fidelity("t", "1", 1, *[1.0] * 5, x) for x in layouts])
    >>> common_layout([ev("turn", "call"), ev("call")]), common_layout([ev("turn", "call"), ev("turn")])
    ('call', 'turn')
    >>> common_layout([ev("turn"), ev("call")]), common_layout([ev()])
    (None, 'call')
    """
    held = [{f.layout for f in e.fidelity} for e in evals if e.fidelity]
    shared = set.intersection(*held) if held else {LAYOUTS[0]}
    return min(shared, key=lambda x: (LAYOUTS.index(x) if x in LAYOUTS else len(LAYOUTS), x), default=None)


def no_common_layout(evals: Iterable[Eval]) -> str:
    """The one line a report gives instead of a fidelity figure when :func:`common_layout` is ``None``:
    the evaluations compared, grouped by the gold layouts each holds."""
    by_layouts: dict[str, list[str]] = {}
    for e in evals:
        name = e.policy + (f" under {e.drift}" if e.drift != NONE else "")
        by_layouts.setdefault("+".join(sorted({f.layout for f in e.fidelity})) or "none", []).append(name)
    held = "; ".join(f"{layouts}: {', '.join(names)}" for layouts, names in sorted(by_layouts.items()))
    return f"no gold layout common to every evaluation compared ({held}): gold-call fidelity not compared"


def arms_layout(results: Results, arms: Iterable[str], drift: str = NONE) -> tuple[str | None, list[Eval]]:
    """:func:`common_layout` of the evaluations of ``arms`` (``"warm_start"``: the warm start's) under
    ``drift``, and those evaluations."""
    evals = [e for arm in dict.fromkeys(arms) for e in evals_of(results, arm, drift)]
    return common_layout(evals), evals


def gold_fidelity(results: Results, arm: str, metric: str, layout: str | None, drift: str = NONE) -> PerTask:
    """:func:`~envace.experiment.results.fidelity_values` pooled over the grid's splits in ``layout``
    (``None``, no common layout: no values)."""
    if layout is None:
        return {}
    return fidelity_values(results, arm, results.experiment.splits, metric, drift, layout=layout)


def code_cell(results: Results) -> str:
    """The report's code row: each git commit the units ran and how many ran it."""
    return ", ".join(f"`{c}`: {n}" for c, n in sorted(results.codes.items())) or "—"


def pauses_cell(results: Results) -> str:
    """The report's pauses row: every entry of ``pauses.json`` with the seconds left out and why."""
    return "; ".join(f"{u}: {p.seconds:.0f} s left out ({p.why})" for u, p in sorted(results.pauses.items())) or "none"
