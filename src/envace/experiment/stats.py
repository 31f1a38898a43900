"""Statistics of the experiment report: task-clustered bootstrap intervals, paired differences, power.

Every outcome of the grid is a per-task value for each seed (``{task_id: [value of seed 0, value of
seed 1, ...]}``). A policy's score is the mean over tasks of the per-task mean over seeds. Tasks may
come in families that share most of their input (BFCL's four categories of one scenario start from
one question and one state), whose outcomes move together: the family is then the unit of
replication. An interval comes from a multi-stage (cluster) percentile bootstrap that resamples
families with replacement, takes every task of each drawn family, and inside every such task
resamples its seed values with replacement (Davison & Hinkley 1997, §3.8). Without families every
task is its own. Families are taken in sorted order (tasks sorted within) and the generator is
``numpy.random.Generator(PCG64(seed))``, so one input gives one interval on every machine; a grid of
one-task families draws exactly what a task-level bootstrap draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
INCONCLUSIVE = "inconclusive at this scale"
_GREATER = frozenset({">", ">=", "≥"})
_LESS = frozenset({"<", "<=", "≤"})
_CHUNK = 256  # bootstrap replicates drawn at once (bounds memory at _CHUNK × tasks × seeds)

TaskValues = Mapping[str, Sequence[float]]
Families = Mapping[str, str]  # task -> its family; a task not in it is its own family


def _family_table(tasks: Sequence[str], families: Families | None) -> np.ndarray:
    """``(families, largest family)`` indices into ``tasks``, -1-padded, families in sorted order.

    >>> _family_table(["a", "b", "c"], {"a": "x", "c": "x"}).tolist()
    [[1, -1], [0, 2]]
    """
    members: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        members.setdefault((families or {}).get(task, task), []).append(i)
    table = np.full((len(members), max(len(m) for m in members.values())), -1, dtype=np.int64)
    for row, key in enumerate(sorted(members)):
        table[row, : len(members[key])] = members[key]
    return table


def _draw(table: np.ndarray, replicates: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Task picks ``(replicates, slots)`` of resampled families and the mask of the slots that hold a task."""
    drawn = table[rng.integers(0, len(table), size=(replicates, len(table)))].reshape(replicates, -1)
    return np.maximum(drawn, 0), drawn >= 0


def _padded(values: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-task value lists as a ``(tasks, max seeds)`` matrix (NaN-padded) and the seed counts."""
    counts = np.array([len(v) for v in values], dtype=np.int64)
    if counts.size == 0 or counts.min() == 0:
        raise ValueError("every task needs at least one value, and there must be at least one task")
    matrix = np.full((len(values), int(counts.max())), np.nan)
    for i, v in enumerate(values):
        matrix[i, : len(v)] = np.asarray(v, dtype=float)
    return matrix, counts


def _task_means(matrix: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return np.nansum(matrix, axis=1) / counts


def _resampled_means(matrix: np.ndarray, counts: np.ndarray, picks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per-slot means ``(replicates, tasks)`` after resampling each picked task's seeds with replacement.

    Args:
        matrix: ``(tasks, max seeds)`` values, NaN-padded.
        counts: ``(tasks,)`` number of seeds of each task.
        picks: ``(replicates, tasks)`` indices of the resampled tasks.
        rng: the generator; draws ``replicates × tasks × max seeds`` uniforms.
    """
    k = counts[picks]  # (B, T)
    width = matrix.shape[1]
    seeds = np.floor(rng.random((*picks.shape, width)) * k[..., None]).astype(np.int64)
    drawn = matrix[picks[..., None], seeds]  # (B, T, width); seed index < k so never NaN
    used = np.arange(width)[None, None, :] < k[..., None]
    return np.where(used, drawn, 0.0).sum(axis=2) / k


def _interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(replicates, [tail, 1.0 - tail])
    return float(lo), float(hi)


def cluster_bootstrap(
    values: TaskValues, n_boot: int = 2000, seed: int = 0, level: float = 0.95, families: Families | None = None
) -> tuple[float, float, float]:
    """Mean over tasks of the per-task mean over seeds, with a cluster percentile bootstrap interval.

    Args:
        values: ``{task_id: [value per seed]}``; every list non-empty.
        n_boot: bootstrap replicates.
        seed: seed of the generator (a fresh one per call: equal inputs give equal intervals).
        level: coverage of the interval.
        families: ``{task_id: family}``: the unit the bootstrap resamples (default: each task its own).

    Returns:
        ``(mean, lo, hi)``.

    >>> cluster_bootstrap({"a": [1.0, 1.0], "b": [0.0, 0.0]}, n_boot=200)[0]
    0.5
    >>> cluster_bootstrap({"a": [0.25], "b": [0.25, 0.25]}, n_boot=50)
    (0.25, 0.25, 0.25)
    """
    tasks = sorted(values)
    matrix, counts = _padded([values[t] for t in tasks])
    table = _family_table(tasks, families)
    rng = np.random.Generator(np.random.PCG64(seed))
    reps = []
    for start in range(0, n_boot, _CHUNK):
        picks, used = _draw(table, min(_CHUNK, n_boot - start), rng)
        means = _resampled_means(matrix, counts, picks, rng)
        reps.append((means * used).sum(axis=1) / used.sum(axis=1))
    lo, hi = _interval(np.concatenate(reps), level)
    return float(_task_means(matrix, counts).mean()), lo, hi


def paired_difference(
    a: TaskValues,
    b: TaskValues,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    families: Families | None = None,
) -> tuple[float, float, float, int]:
    """Mean over the shared tasks of ``mean(a[task]) − mean(b[task])``, with a paired cluster bootstrap.

    One resample of families serves both sides (the pairing); inside every resampled task the seeds
    of ``a`` and of ``b`` are resampled independently.

    Args:
        a: ``{task_id: [value per seed]}`` of the first policy.
        b: the same for the second; tasks only one side has are left out.
        n_boot: bootstrap replicates.
        seed: seed of the generator.
        level: coverage of the interval.
        families: ``{task_id: family}``: the unit the bootstrap resamples (default: each task its own).

    Returns:
        ``(mean difference, lo, hi, number of shared tasks)``.

    >>> paired_difference({"x": [0.75], "y": [0.5], "z": [1.0]}, {"x": [0.25], "y": [0.0]}, n_boot=50)
    (0.5, 0.5, 0.5, 2)
    """
    tasks = sorted(set(a) & set(b))
    if not tasks:
        raise ValueError("the two sides share no task")
    ma, ca = _padded([a[t] for t in tasks])
    mb, cb = _padded([b[t] for t in tasks])
    table = _family_table(tasks, families)
    rng = np.random.Generator(np.random.PCG64(seed))
    reps = []
    for start in range(0, n_boot, _CHUNK):
        picks, used = _draw(table, min(_CHUNK, n_boot - start), rng)
        diff = _resampled_means(ma, ca, picks, rng) - _resampled_means(mb, cb, picks, rng)
        reps.append((diff * used).sum(axis=1) / used.sum(axis=1))
    lo, hi = _interval(np.concatenate(reps), level)
    return float((_task_means(ma, ca) - _task_means(mb, cb)).mean()), lo, hi, len(tasks)


def minimum_detectable_difference(
    p: float, n_tasks: int, n_seeds: int, alpha: float = 0.05, power: float = 0.8
) -> float:
    """Smallest difference of two success rates a two-sided test detects: ``(z₁₋α/₂ + z_power)·√(2p(1−p)/(n·k))``.

    Normal approximation for two proportions with ``n·k`` independent outcomes per side (``n`` tasks,
    ``k`` seeds). Outcomes of one task are correlated, so the true value is larger.

    Args:
        p: the success rate both sides are assumed to share.
        n_tasks: tasks per side.
        n_seeds: seeds per task.
        alpha: two-sided significance level.
        power: probability of detecting a difference of the returned size.

    >>> round(minimum_detectable_difference(0.5, 100, 1), 4)  # 2.8016 · √(0.5/100)
    0.1981
    """
    if not 0.0 <= p <= 1.0 or n_tasks < 1 or n_seeds < 1:
        raise ValueError(f"need 0 <= p <= 1 and positive counts, got p={p}, n_tasks={n_tasks}, n_seeds={n_seeds}")
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0) + NormalDist().inv_cdf(power)
    return z * math.sqrt(2.0 * p * (1.0 - p) / (n_tasks * n_seeds))


def verdict(lo: float, hi: float, direction: str) -> str:
    """Verdict on a hypothesis about a difference from its interval ``[lo, hi]``.

    ``direction`` is the hypothesised side of 0: ``">"``/``"≥"``/``">="`` or ``"<"``/``"≤"``/``"<="``.
    Conservatively, a "≥" hypothesis is supported only like a ">" one (``lo > 0``): an interval that
    touches 0 cannot tell "holds" from "falls a little". Contradicted when the interval lies strictly
    on the other side (``hi < 0`` for ">"); otherwise inconclusive at this scale.

    >>> verdict(0.1, 0.3, "≥"), verdict(0.0, 0.3, "≥"), verdict(-0.3, -0.1, ">"), verdict(-0.3, -0.1, "<")
    ('supported', 'inconclusive at this scale', 'contradicted', 'supported')
    """
    if direction in _GREATER:
        return SUPPORTED if lo > 0 else CONTRADICTED if hi < 0 else INCONCLUSIVE
    if direction in _LESS:
        return SUPPORTED if hi < 0 else CONTRADICTED if lo > 0 else INCONCLUSIVE
    raise ValueError(f"direction must be one of > >= ≥ < <= ≤, got {direction!r}")
