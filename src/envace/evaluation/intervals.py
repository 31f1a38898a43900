"""95 % intervals of a benchmark's table values: a stratified task bootstrap through its own aggregation.

Tasks are the unit of replication. A replicate resamples, inside every category, as many tasks as
the category has, with replacement, each with all its trials, and runs the benchmark's own
:meth:`~envace.evaluation.base.Benchmark.summarize` on them, so the interval of an aggregate (BFCL's
weighted Overall, tau2's pass^k) is the interval of that aggregate and not of a plain mean. A task
drawn twice enters as two tasks (renamed ``<id>#<k>``), so per-task statistics such as pass^k count
it twice rather than merging its trials. The interval is the percentile interval of the replicates
(Efron & Tibshirani 1993, §13.3); the generator is ``numpy.random.Generator(PCG64(seed))``, so one
input gives one interval.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from envace.evaluation.base import ItemResult, Summary

#: item records (tasks × trials) above which the number of replicates shrinks to keep one
#: interval within a few seconds
WORK = 1_000_000


def _strata(items: list[ItemResult]) -> list[list[list[ItemResult]]]:
    """Per category (first-seen order), each task's items (its trials)."""
    per: dict[tuple[str, str], list[ItemResult]] = {}
    for it in items:
        per.setdefault((it.category, it.task_id), []).append(it)
    out: dict[str, list[list[ItemResult]]] = {}
    for (category, _), group in per.items():
        out.setdefault(category, []).append(group)
    return list(out.values())


def _renamed(group: list[ItemResult], k: int) -> list[ItemResult]:
    """The ``k``-th draw of a task within one replicate: the task itself, then copies ``<id>#<k>``."""
    return group if k == 0 else [dataclasses.replace(it, task_id=f"{it.task_id}#{k}") for it in group]


def bootstrap_interval(
    summarize: Callable[[list[ItemResult]], list[Summary]], items: list[ItemResult], metric: str, category: str,
    n_boot: int = 1000, seed: int = 0, level: float = 0.95,
) -> tuple[float, float, int] | None:  # fmt: skip
    """``(lo, hi, replicates)`` of ``metric`` of ``category`` over ``items``; ``None`` without items
    or when no replicate has that row. ``n_boot`` shrinks (to 200 at least) for large ``items``."""
    strata = _strata(items)
    if not strata:
        return None
    n_boot = max(200, min(n_boot, WORK // max(1, len(items))))
    rng = np.random.Generator(np.random.PCG64(seed))
    copies: dict[tuple[int, int, int], list[ItemResult]] = {}  # (stratum, task, draw) -> its items
    values = []
    for _ in range(n_boot):
        sample: list[ItemResult] = []
        for s, groups in enumerate(strata):
            drawn: dict[int, int] = {}
            for t in rng.integers(0, len(groups), len(groups)).tolist():
                k = drawn[t] = drawn.get(t, -1) + 1
                if (s, t, k) not in copies:
                    copies[(s, t, k)] = _renamed(groups[t], k)
                sample += copies[(s, t, k)]
        value = next((r.value for r in summarize(sample) if r.metric == metric and r.category == category), None)
        if value is not None:
            values.append(float(value))
    if not values:
        return None
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(values, [tail, 1.0 - tail])
    return float(lo), float(hi), len(values)
