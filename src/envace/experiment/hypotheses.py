"""The paper's hypotheses H1–H4, each judged from the result files by an explicit rule.

Every verdict is one of ``supported``, ``contradicted``, ``inconclusive at this scale`` (from
:func:`~envace.experiment.stats.verdict` and the rule of the hypothesis) or ``not tested (...)`` when
an arm it needs is not in the grid or has no evaluation yet. Success is the official checker's, with
no rehearsal (setting ``none``), pooled over the grid's splits; differences are paired by task. H4's
gains of a rehearsal setting over ``none`` are paired on task × seed cells: with ``evaluation.rehearsal_seeds``,
``none`` on the seeds the setting was evaluated on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from envace.data.pools import family_of
from envace.experiment.results import WARM, Item, Results, evals_of, fidelity_values, item_values, paired_item_values
from envace.experiment.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    SUPPORTED,
    cluster_bootstrap,
    paired_difference,
)
from envace.experiment.stats import verdict as interval_verdict

ENVACE, REAL_ENV, SIMULATOR, SFT_ONLY = "envace", "real_env", "simulator", "sft_only"
CONTROL_ARMS = (REAL_ENV, SIMULATOR)  # arms whose RL does not train the rehearse role
FIDELITY_TOLERANCE = 0.02  # H3: a fall of gold-call value_f1 smaller than this still "holds"
NONE = "none"

STATEMENTS = {
    "H1": "envace ≥ real_env on held-out tasks, at zero environment calls during RL",
    "H2": "envace > simulator and envace > sft_only",
    "H3": "under task-only reward, envace's gold-call fidelity rises or holds from the warm start",
    "H4": "private rehearsal helps envace and does not help the warm-start policy",
}


class Verdict(NamedTuple):
    """One hypothesis: its statement, the verdict, the numbers it rests on and the rule applied."""

    name: str
    statement: str
    verdict: str
    evidence: str
    rule: str


Interval = tuple[float, float, float]
Diff = tuple[float, float, float, int]
PerTask = dict[str, list[float]]  # task key -> one value per seed


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


def _statement(results: Results, name: str) -> str:
    given = results.experiment.hypotheses.get(name)
    if isinstance(given, dict):
        given = given.get("statement")
    return given if isinstance(given, str) else STATEMENTS[name]


def _untested(results: Results, arms: tuple[str, ...]) -> str | None:
    for arm in arms:
        if arm != WARM and arm not in results.experiment.arms:
            return f"not tested (arm {arm} not in the grid)"
        if not evals_of(results, arm):
            return f"not tested (no evaluation of {'the warm start' if arm == WARM else 'arm ' + arm} yet)"
    return None


def _diff_text(label: str, d: Diff) -> str:
    return f"{label} = {format_interval(d)} over {d[3]} tasks"


def _h1(results: Results, boot: Boot) -> tuple[str, str]:
    d = boot.diff(success(results, ENVACE), success(results, REAL_ENV))
    runs = [r for r in results.runs if r.arm == ENVACE]
    if d is None or not runs:
        return "not tested (no shared evaluated tasks or no envace run results)", ""
    calls = ", ".join(f"s{r.seed}: {r.cost['env_calls']}" for r in runs)
    evidence = f"{_diff_text('pooled success envace − real_env', d)}; envace env_calls per run: {calls}"
    if any(r.cost["env_calls"] for r in runs):
        return CONTRADICTED, evidence + " (the envace runs called the environment: not zero-call RL)"
    return interval_verdict(d[1], d[2], "≥"), evidence


def _h2(results: Results, boot: Boot) -> tuple[str, str]:
    mine = success(results, ENVACE)
    diffs = {arm: boot.diff(mine, success(results, arm)) for arm in (SIMULATOR, SFT_ONLY)}
    found = {arm: d for arm, d in diffs.items() if d is not None}
    if len(found) < len(diffs):
        return "not tested (no evaluated tasks shared with envace)", ""
    verdicts = [interval_verdict(d[1], d[2], ">") for d in found.values()]
    evidence = "; ".join(_diff_text(f"pooled success envace − {arm}", d) for arm, d in found.items())
    if CONTRADICTED in verdicts:
        return CONTRADICTED, evidence
    return (SUPPORTED if all(v == SUPPORTED for v in verdicts) else INCONCLUSIVE), evidence


def _h3(results: Results, boot: Boot) -> tuple[str, str]:
    splits = results.experiment.splits
    warm = fidelity_values(results, WARM, splits)
    d = boot.diff(fidelity_values(results, ENVACE, splits), warm)
    if d is None:
        return "not tested (no gold-call fidelity shared by envace and the warm start)", ""
    controls = [a for a in CONTROL_ARMS if a in results.experiment.arms]
    cd = {a: boot.diff(fidelity_values(results, a, splits), warm) for a in controls}
    parts = [_diff_text("value_f1 envace − warm start", d)]
    parts += [_diff_text(f"{a} − warm start", c) if c else f"{a}: no fidelity data" for a, c in cd.items()]
    if not controls:
        parts.append(f"no control arm ({', '.join(CONTROL_ARMS)}) in the grid: only the envace condition applies")
    if d[2] < 0:
        return CONTRADICTED, "; ".join(parts)
    controls_fell = all(c is not None and c[2] < 0 for c in cd.values())
    return (SUPPORTED if d[1] > -FIDELITY_TOLERANCE and controls_fell else INCONCLUSIVE), "; ".join(parts)


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


def _h4(results: Results, boot: Boot) -> tuple[str, str]:
    best = best_gain(results, ENVACE, boot)
    if best is None:
        return "not tested (no rehearsal setting besides none was evaluated for envace)", ""
    setting, mine = best
    warm = gain(results, WARM, setting, boot)
    if warm is None:
        return f"not tested (the warm start was not evaluated with {setting})", ""
    evidence = f"{_diff_text(f'envace gain of {setting} over none', mine)}; {_diff_text('warm-start gain', warm)}"
    if mine[2] < 0:
        return CONTRADICTED, evidence
    return (SUPPORTED if mine[1] > 0 and warm[1] <= 0 else INCONCLUSIVE), evidence


_RULES = {
    "H1": "supported if the interval of envace − real_env lies above 0 (lo > 0: '≥' is judged like '>'); contradicted "
    "if hi < 0 or any envace run has env_calls > 0; otherwise inconclusive",
    "H2": "supported if both differences have lo > 0; contradicted if either has hi < 0; otherwise inconclusive",
    "H3": "contradicted (checked first) if envace − warm start has hi < 0; supported if its "
    f"lo > −{FIDELITY_TOLERANCE} and every control arm in the grid ({', '.join(CONTROL_ARMS)}) has "
    "(arm − warm start) hi < 0; otherwise inconclusive",
    "H4": "the best setting is the one of largest mean gain for envace (chosen on the same data, so this favours "
    "'supported'); supported if envace's gain has lo > 0 and the warm start's gain in that setting has lo ≤ 0; "
    "contradicted if envace's gain has hi < 0; otherwise inconclusive",
}
_NEEDS = {"H1": (ENVACE, REAL_ENV), "H2": (ENVACE, SIMULATOR, SFT_ONLY), "H3": (ENVACE, WARM), "H4": (ENVACE, WARM)}
_JUDGES = {"H1": _h1, "H2": _h2, "H3": _h3, "H4": _h4}


def judge(results: Results, boot: Boot) -> list[Verdict]:
    """The verdicts on H1–H4, in order.

    Args:
        results: the loaded results.
        boot: the bootstrap settings of the report.
    """
    out = []
    for name, judge_one in _JUDGES.items():
        untested = _untested(results, _NEEDS[name])
        outcome, evidence = (untested, "") if untested else judge_one(results, boot)
        out.append(Verdict(name, _statement(results, name), outcome, evidence, _RULES[name]))
    return out
