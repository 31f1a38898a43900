"""The report's view of training: what each arm's RL did step by step, and what its final policies
gained and lost against the warm start, task by task.

The numbers are pure functions of a run's ``train/*`` curves (``[(step, value), ...]``, one point per
RL step) and of per-task official success; a curve a result file lacks (files written before the
runs kept ``train/*``) gives ``None``, which the tables render as "—". The rendering is the two
``*_section`` functions at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from envace.experiment.hypotheses import NONE, families, fmt, markdown_table
from envace.experiment.results import WARM, Results, Run, eval_item_values, evals_of

Curve = list[tuple[int, float]]

REWARD, SUCCESS, KL = "train/reward/all", "train/success/all", "train/rl/kl"
ZERO_GROUPS, CLIP = "train/rl/adv/zero_group_frac", "train/rl/clip_frac"
FORMAT_ERRORS, TRUNCATION = "train/rollout/format_error_rate", "train/rollout/truncation_rate"
ACT_TOKENS = "train/rollout/act_tokens"
DISAGREE, REWARD_ONLY = "train/official/disagree/all", "train/official/proxy_only/all"
OFFICIAL_ONLY, SCORED = "train/official/official_only/all", "train/official/scored"
MOVING_AVERAGE = 4  #: steps of the training figure's moving average of the reward


def thirds(curve: Curve) -> tuple[float, float] | None:
    """Mean of the first and of the last third of a curve, in step order (``max(1, n // 3)`` points each).

    >>> thirds([(3, 6.0), (0, 0.0), (1, 2.0), (2, 4.0), (4, 8.0), (5, 10.0)])
    (1.0, 9.0)
    >>> thirds([(0, 1.0)]), thirds([])
    ((1.0, 1.0), None)
    """
    if not curve:
        return None
    values = [v for _, v in sorted(curve)]
    k = max(1, len(values) // 3)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def curve_mean(curve: Curve) -> float | None:
    """Mean over a curve's steps; ``None`` when empty."""
    return sum(v for _, v in curve) / len(curve) if curve else None


def curve_max(curve: Curve) -> float | None:
    """Largest value of a curve; ``None`` when empty."""
    return max(v for _, v in curve) if curve else None


def moving_average(values: Sequence[float], window: int = MOVING_AVERAGE) -> list[float]:
    """Trailing moving average: each point is the mean of itself and up to ``window - 1`` points before it.

    >>> moving_average([0.0, 4.0, 2.0, 6.0, 8.0], 2)
    [0.0, 2.0, 3.0, 4.0, 7.0]
    """
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


class Agreement(NamedTuple):
    """The official checker against the training reward on the training episodes, in episodes: those both
    scored, those where the two disagree on success, and by direction (the reward passed what the checker
    fails / the checker passed what the reward fails)."""

    scored: float
    disagree: float
    reward_only: float
    official_only: float

    def __add__(self, other: object) -> Agreement:  # type: ignore[override]
        assert isinstance(other, Agreement)
        return Agreement(*(a + b for a, b in zip(self, other, strict=True)))

    @property
    def share(self) -> float | None:
        return self.disagree / self.scored if self.scored else None


def agreement(curves: dict[str, Curve]) -> Agreement | None:
    """Episodes counted from a run's per-step shares: ``Σ_steps share × scored`` for each direction and
    ``Σ_steps scored``; ``None`` when a curve is missing.

    >>> curves = {SCORED: [(0, 16.0), (1, 8.0)], DISAGREE: [(0, 0.125), (1, 0.25)],
    ...           REWARD_ONLY: [(0, 0.0625), (1, 0.0)], OFFICIAL_ONLY: [(0, 0.0625), (1, 0.25)]}
    >>> agreement(curves)
    Agreement(scored=24.0, disagree=4.0, reward_only=1.0, official_only=3.0)
    """
    if any(tag not in curves for tag in (SCORED, DISAGREE, REWARD_ONLY, OFFICIAL_ONLY)):
        return None
    scored = dict(curves[SCORED])

    def episodes(tag: str) -> float:
        return sum(share * scored.get(step, 0.0) for step, share in curves[tag])

    return Agreement(sum(scored.values()), episodes(DISAGREE), episodes(REWARD_ONLY), episodes(OFFICIAL_ONLY))


@dataclass(frozen=True)
class TrainingRow:
    """One arm's training, each number the mean over its runs that logged the curve (``None``: none did);
    ``agreement`` is pooled (summed) over the runs."""

    arm: str
    runs: int
    reward: tuple[float, float] | None  #: first → last third
    success: tuple[float, float] | None  #: first → last third
    kl_max: float | None
    zero_groups: float | None
    clip: float | None
    format_errors: tuple[float, float] | None  #: first → last third
    truncation: float | None
    act_tokens: float | None
    agreement: Agreement | None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _mean_pair(pairs: Iterable[tuple[float, float] | None]) -> tuple[float, float] | None:
    present = [p for p in pairs if p is not None]
    if not present:
        return None
    return sum(p[0] for p in present) / len(present), sum(p[1] for p in present) / len(present)


def training_row(arm: str, runs: Sequence[Run]) -> TrainingRow:
    """The :class:`TrainingRow` of an arm from its runs (one per seed)."""

    def per_run(tag: str, reduce: Callable[[Curve], float | None]) -> float | None:
        return _mean(reduce(r.curves[tag]) for r in runs if tag in r.curves)

    def per_run_thirds(tag: str) -> tuple[float, float] | None:
        return _mean_pair(thirds(r.curves[tag]) for r in runs if tag in r.curves)

    agreements = [a for r in runs if (a := agreement(r.curves)) is not None]
    return TrainingRow(
        arm=arm,
        runs=len(runs),
        reward=per_run_thirds(REWARD),
        success=per_run_thirds(SUCCESS),
        kl_max=per_run(KL, curve_max),
        zero_groups=per_run(ZERO_GROUPS, curve_mean),
        clip=per_run(CLIP, curve_mean),
        format_errors=per_run_thirds(FORMAT_ERRORS),
        truncation=per_run(TRUNCATION, curve_mean),
        act_tokens=per_run(ACT_TOKENS, curve_mean),
        agreement=sum(agreements[1:], agreements[0]) if agreements else None,
    )


def has_training_curves(results: Results) -> bool:
    """Whether any run file holds the training reward or KL curve (files before ``train/*`` were kept do not)."""
    return any(REWARD in r.curves or KL in r.curves for r in results.runs)


class GainedLost(NamedTuple):
    """One policy against the warm start on the tasks both were evaluated on (official success)."""

    tasks: int
    warm_passes: float
    passes: float
    gained: int  #: tasks the policy passes that the warm start failed
    lost: int  #: tasks the policy fails that the warm start passed
    gained_families: int  #: families (:func:`~envace.experiment.hypotheses.families`) of the gained tasks
    lost_families: int  #: families of the lost tasks


def gained_lost(warm: dict[str, float], policy: dict[str, float]) -> GainedLost:
    """Compare per-task success (1 pass, 0 fail) of a policy with the warm start's on the tasks both have.

    >>> gained_lost({"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}, {"a": 0.0, "b": 1.0, "c": 1.0, "e": 1.0})
    GainedLost(tasks=3, warm_passes=1.0, passes=2.0, gained=2, lost=1, gained_families=2, lost_families=1)
    >>> gained_lost({"v/multi_turn_base_5": 1.0, "v/multi_turn_miss_func_5": 1.0}, {"v/multi_turn_base_5": 0.0,
    ...             "v/multi_turn_miss_func_5": 0.0})[-2:]
    (0, 1)
    """
    shared = sorted(set(warm) & set(policy))
    family = families(shared)
    gained = [k for k in shared if policy[k] > warm[k]]
    lost = [k for k in shared if policy[k] < warm[k]]
    return GainedLost(
        tasks=len(shared),
        warm_passes=sum(warm[k] for k in shared),
        passes=sum(policy[k] for k in shared),
        gained=len(gained),
        lost=len(lost),
        gained_families=len({family[k] for k in gained}),
        lost_families=len({family[k] for k in lost}),
    )


# --- rendering -----------------------------------------------------------------------------------


def _cell(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else fmt(x) if digits == 3 else f"{x:.{digits}f}"


def _arrow(pair: tuple[float, float] | None) -> str:
    return "—" if pair is None else f"{fmt(pair[0])} → {fmt(pair[1])}"


def _agreement_cell(a: Agreement | None) -> str:
    if a is None or a.share is None:
        return "—"
    return f"{fmt(a.share)} ({a.reward_only:.0f} / {a.official_only:.0f} of {a.scored:.0f})"


def _cells(row: TrainingRow) -> list[str]:
    rates = (_cell(row.zero_groups), _cell(row.clip), _arrow(row.format_errors), _cell(row.truncation))
    return [row.arm, str(row.runs), _arrow(row.reward), _arrow(row.success), _cell(row.kl_max, 4), *rates,
            _cell(row.act_tokens, 1), _agreement_cell(row.agreement)]  # fmt: skip


def training_rows(results: Results) -> list[TrainingRow]:
    """One :class:`TrainingRow` per arm of the grid, in the grid's order."""
    return [training_row(arm, [r for r in results.runs if r.arm == arm]) for arm in results.experiment.arms]


def training_section(results: Results) -> list[str]:
    """The report's "Training" section: one row per arm from its runs' ``train/*`` curves."""
    header = [
        "arm", "runs", "reward (first → last third)", "success (first → last third)", "KL to warm start (max)",
        "groups without variance", "clip fraction", "format errors (first → last third)", "truncation",
        "act tokens per episode", "official ≠ reward (reward-only / official-only of scored)",
    ]  # fmt: skip
    rows = [_cells(row) for row in training_rows(results)]
    return [
        "## Training",
        "",
        "What RL did, from each run's `train/*` curves (one point per RL step, on the training episodes): the mean "
        "over the arm's runs (one per seed; a run without a curve is left out of that cell). first → last third: "
        "the mean over the first and over the last third of the RL steps. KL to the warm start (`train/rl/kl`): "
        "its largest value over the steps. Groups without variance (`train/rl/adv/zero_group_frac`: GRPO groups "
        "whose episodes all got one reward, so no gradient), clip fraction, truncation rate and act tokens per "
        "episode: means over the steps. Official ≠ reward (`train/official/*`): the share of the training "
        "episodes where the official checker's success and the training reward's disagree, pooled over the arm's "
        "runs (Σ disagree × scored / Σ scored over steps), with the episodes by direction: the reward passed what "
        "the checker fails / the checker passed what the reward fails. "
        "—: no such curve in the result files (files written before the runs kept `train/*`).",
        "",
        *markdown_table(header, rows),
        "",
    ]


def against_warm_start_section(results: Results) -> list[str]:
    """The report's task-by-task comparison of each run's final policy with the warm start (setting ``none``)."""
    splits = results.experiment.splits
    title = ["## Against the warm start, task by task", ""]
    warm_evals = evals_of(results, WARM)
    if not warm_evals:
        return [*title, "No evaluation of the warm start yet.", ""]
    warm = eval_item_values(warm_evals[0], "success", splits, NONE)
    rows = []
    for arm in results.experiment.arms:
        for e in evals_of(results, arm):
            g = gained_lost(warm, eval_item_values(e, "success", splits, NONE))
            rows.append([arm, str(e.seed), str(g.tasks), f"{g.warm_passes:g}", f"{g.passes:g}",
                         f"{g.gained} ({g.gained_families})", f"{g.lost} ({g.lost_families})"])  # fmt: skip
    return [
        *title,
        "Each run's final policy against the warm start it started from, on the tasks both were evaluated on "
        "(official success, setting `none`, pooled over splits): gained = tasks the policy passes that the warm "
        "start failed, lost = tasks it fails that the warm start passed; in brackets, the families those tasks "
        "fall in (the categories of one BFCL scenario are one family: they share the first turn's state and, "
        "mostly, its question). A difference of pass counts hides how many tasks moved each way; these do not.",
        "",
        *markdown_table(["arm", "seed", "tasks", "warm start passes", "policy passes", "gained", "lost"], rows),
        "",
    ]
