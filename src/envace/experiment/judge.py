"""Hypotheses as data: a study declares each of its hypotheses in its config, one generic function judges them.

A declaration (docs/experiment.md, "Hypotheses") names the differences it predicts (``compare``: arm
``a`` − arm ``b``, or ``a``'s gain of a rehearsal setting over ``none``), the metric and the tasks they
are read on (``where``: splits and a task-id pattern, a stratum), the rule (``superiority``, or
``non_inferiority`` with a ``margin``), what would make it undecidable (``precondition``), the
arms whose RL must not have called the environment (``zero_env_calls``) and the controls whose
predicted outcome (``below``, ``above``, ``null``, ``not_above`` 0) it needs besides. Every number is
a paired, task-family bootstrap interval (:class:`~envace.experiment.hypotheses.Boot`).

Every verdict is ``supported``, ``contradicted``, ``inconclusive at this scale``, ``not decidable (...)``
or ``not tested (...)``:

- a primary difference is *contradicted* when its interval lies below ``fails_below`` (default 0 for
  superiority, −margin for non-inferiority; checked first), *supported* when it lies above 0
  (superiority) or above −margin (non-inferiority);
- the hypothesis is contradicted when any primary difference is, or when an arm of ``zero_env_calls``
  called the environment; supported when every primary difference is and every control met its
  prediction (and, with ``every_seed``, every seed's own difference lies above the floor: runs as
  units); inconclusive otherwise.

The evidence of a ``success`` difference names each seed's difference too (:func:`seed_differences`):
the interval resamples tasks, the seeds' signs show how far the runs agree.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from envace.experiment.hypotheses import (
    NONE,
    Boot,
    Diff,
    PerTask,
    arms_layout,
    best_gain,
    format_interval,
    gold_fidelity,
    no_common_layout,
    rehearsal_success,
)
from envace.experiment.results import WARM, Results, eval_item_values, evals_of, item_values
from envace.experiment.stats import CONTRADICTED, INCONCLUSIVE, SUPPORTED

METRICS = ("success", "value_f1", "decision_f1", "gain")
FIDELITY = ("value_f1", "decision_f1")  #: gold-call fidelity, read in one gold layout both sides hold
RULES = ("superiority", "non_inferiority")
PREDICTIONS = {  # a control's predicted outcome: its test on the interval (lo, hi) and its words
    "below": (lambda lo, hi: hi < 0, "hi < 0"),
    "above": (lambda lo, hi: lo > 0, "lo > 0"),
    "not_above": (lambda lo, hi: lo <= 0, "lo ≤ 0"),
    "null": (lambda lo, hi: lo <= 0 <= hi, "lo ≤ 0 ≤ hi"),
}


class Verdict(NamedTuple):
    """One hypothesis: its statement, the verdict, the numbers it rests on and the rule applied."""

    name: str
    statement: str
    verdict: str
    evidence: str
    rule: str


@dataclass(frozen=True)
class Comparison:
    """One difference: ``a − b`` of ``metric`` per task, or (``metric: gain``) ``a``'s gain of ``setting``
    over ``none`` (``setting: best``: the setting of the largest mean gain of the hypothesis's first ``a``).

    ``where`` keeps the tasks of some splits and task ids (``{split: [val], task: "*_s5_*"}``, an
    fnmatch pattern): a stratum. ``label`` names the difference in the evidence."""

    a: str
    b: str | None = None
    metric: str = "success"
    setting: str = NONE
    where: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    predict: str | None = None  # controls only: below, above, not_above, null
    required: bool = False  # controls only: an arm not in the grid or without data leaves it untested


@dataclass(frozen=True)
class Hypothesis:
    """A declared hypothesis (see the module docstring); ``explain``: the rule in words, as printed
    (default: written from the fields)."""

    name: str
    statement: str
    compare: tuple[Comparison, ...]
    rule: str = "superiority"
    margin: float = 0.0
    fails_below: float | None = None
    zero_env_calls: tuple[str, ...] = ()
    controls: tuple[Comparison, ...] = ()
    precondition: dict[str, Any] | None = None
    every_seed: bool = False
    explain: str | None = None

    @property
    def floor(self) -> float:
        """Where a primary difference's interval must lie above to be supported."""
        return -self.margin if self.rule == "non_inferiority" else 0.0

    @property
    def fails(self) -> float:
        return self.floor if self.fails_below is None else self.fails_below


def _comparison(raw: Any, where: str, control: bool) -> Comparison:
    if not isinstance(raw, dict) or "a" not in raw:
        raise ValueError(f"{where}: expected {{a: <arm>, b: <arm>, metric: ...}}, got {raw!r}")
    allowed = {f for f in Comparison.__dataclass_fields__ if control or f not in ("predict", "required")}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(allowed))})")
    c = Comparison(**raw)
    if c.metric not in METRICS:
        raise ValueError(f"{where}.metric: {c.metric!r} is not one of {', '.join(METRICS)}")
    if (c.b is None) != (c.metric == "gain"):
        raise ValueError(f"{where}: a gain compares one arm with itself (no b); {c.metric} needs b")
    if control and c.predict not in PREDICTIONS:
        raise ValueError(f"{where}.predict: expected one of {', '.join(PREDICTIONS)}, got {c.predict!r}")
    if set(c.where) - {"split", "task"}:
        raise ValueError(f"{where}.where: only split and task filter tasks, got {sorted(c.where)}")
    return c


def parse(raw: Any, source: str = "hypotheses") -> list[Hypothesis]:
    """Declarations from a list of mappings (a study's ``hypotheses:``); a wrong field is a one-line error."""
    if not isinstance(raw, list):
        raise ValueError(f"{source}: expected a list of hypotheses, got {type(raw).__name__}")
    out = []
    for i, entry in enumerate(raw):
        where = f"{source}[{i}]"
        if not isinstance(entry, dict) or not {"name", "statement", "compare"} <= set(entry):
            raise ValueError(f"{where}: a hypothesis needs name, statement and compare")
        unknown = sorted(set(entry) - set(Hypothesis.__dataclass_fields__))
        if unknown:
            raise ValueError(f"{where}: unknown field {unknown[0]!r}")
        fields = dict(entry)
        fields["compare"] = tuple(_comparison(c, f"{where}.compare", False) for c in entry["compare"] or [])
        fields["controls"] = tuple(_comparison(c, f"{where}.controls", True) for c in entry.get("controls") or [])
        fields["zero_env_calls"] = tuple(entry.get("zero_env_calls") or ())
        hyp = Hypothesis(**fields)
        if not hyp.compare or hyp.rule not in RULES or hyp.margin < 0:
            raise ValueError(f"{where}: needs a comparison, a rule among {', '.join(RULES)} and a margin >= 0")
        if hyp.every_seed and any(c.metric != "success" for c in hyp.compare):
            raise ValueError(f"{where}: every_seed judges success differences only")
        if hyp.precondition is not None and set(hyp.precondition) - {"a", "b", "metric", "where", "at_least"}:
            raise ValueError(f"{where}.precondition: expected {{a, b, metric, where, at_least}}")
        out.append(hyp)
    return out


def load(value: str | list[Any] | None) -> list[Any]:
    """The declarations a config gives (a YAML file's path, or the list itself), checked, as written."""
    if value is None:
        return []
    declared: Any = value
    source = f"hypotheses ({value})" if isinstance(value, str) else "hypotheses"
    if isinstance(value, str):
        try:
            declared = yaml.safe_load(Path(value).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{source}: {getattr(exc, 'strerror', None) or 'not YAML'}") from exc
    parse(declared, source)
    return list(declared)


def _name(arm: str) -> str:
    return "warm start" if arm == WARM else arm


def _values(results: Results, c: Comparison, setting: str) -> tuple[PerTask, PerTask]:
    splits = results.experiment.splits
    if c.metric == "gain":
        pair = rehearsal_success(results, c.a, setting)
    elif c.metric in FIDELITY:
        layout = _layout(results, c)
        pair = gold_fidelity(results, c.a, c.metric, layout), gold_fidelity(results, c.b or WARM, c.metric, layout)
    else:
        pair = (
            item_values(results, c.a, "success", splits, c.setting),
            item_values(results, c.b or WARM, "success", splits, c.setting),
        )
    keep = _kept(c, splits)
    a, b = ({k: v for k, v in side.items() if keep(k)} for side in pair)
    return a, b


def _layout(results: Results, c: Comparison) -> str | None:
    """The gold layout a fidelity comparison reads: one both sides' evaluations hold, ``call`` first."""
    return arms_layout(results, [c.a, c.b or WARM])[0]


def _named(results: Results, c: Comparison, setting: str) -> str:
    """:func:`label`, a fidelity comparison's naming the gold layout it reads."""
    layout = _layout(results, c) if c.metric in FIDELITY else None
    return label(c, setting) + (f" ({layout} gold layout)" if layout else "")


def _no_data(results: Results, c: Comparison, name: str) -> str:
    """Why ``c`` has no interval: its sides share no gold layout (one line, each side's), or no data."""
    return f"{name}: {_unshared(results, c) or 'no data'}"


def _unshared(results: Results, c: Comparison) -> str | None:
    """For a fidelity comparison whose sides share no gold layout, the line that says so; else ``None``."""
    layout, evals = arms_layout(results, [c.a, c.b or WARM])
    return no_common_layout(evals) if c.metric in FIDELITY and layout is None else None


def _kept(c: Comparison, splits: list[str]) -> Callable[[str], bool]:
    """Whether a task key (``<split>/<task id>``) is one of the tasks ``c`` is read on (its ``where``)."""
    wanted = c.where.get("split", splits)
    wanted, pattern = ([wanted] if isinstance(wanted, str) else wanted), str(c.where.get("task", "*"))

    def keep(key: str) -> bool:
        split, _, task = key.partition("/")
        return split in wanted and fnmatch.fnmatchcase(task, pattern)

    return keep


def seed_differences(results: Results, c: Comparison) -> list[tuple[int | None, float]]:
    """Each of ``c.a``'s seeds' own success difference on ``c``'s tasks: the mean over the tasks both
    sides have of that seed's value − ``c.b``'s mean over its seeds (the runs as units, beside the
    interval that resamples tasks). A ``success`` comparison only.

    Returns:
        ``(seed, difference)`` per evaluation of ``c.a``, by seed; none where the sides share no task.
    """
    splits = results.experiment.splits
    _, b = _values(results, c, c.setting)
    keep, out = _kept(c, splits), []
    for e in evals_of(results, c.a):
        mine = {k: v for k, v in eval_item_values(e, "success", splits, c.setting).items() if keep(k)}
        shared = sorted(set(mine) & set(b))
        if shared:
            out.append((e.seed, sum(mine[k] - sum(b[k]) / len(b[k]) for k in shared) / len(shared)))
    return out


def _seeds_evidence(name: str, per_seed: list[tuple[int | None, float]]) -> str:
    return f"{name} by seed: " + ", ".join(f"s{seed} {d:+.3f}" for seed, d in per_seed)


def diff(results: Results, c: Comparison, boot: Boot, setting: str | None = None) -> Diff | None:
    """The paired interval of one comparison (``setting``: the one a ``best`` gain chose)."""
    return boot.diff(*_values(results, c, setting or c.setting))


def label(c: Comparison, setting: str) -> str:
    """The words of a comparison in the evidence: its ``label``, or one written from its fields."""
    if c.label:
        return c.label.replace("{setting}", setting)
    if c.metric == "gain":
        return f"{_name(c.a)} gain of {setting} over none"
    metric = "pooled success" if c.metric == "success" else c.metric
    return f"{metric} {_name(c.a)} − {_name(c.b or WARM)}"


def _untested(results: Results, h: Hypothesis) -> str | None:
    arms = [arm for c in (*h.compare, *(c for c in h.controls if c.required)) for arm in (c.a, c.b or WARM)]
    for arm in dict.fromkeys(arms):
        if arm != WARM and arm not in results.experiment.arms:
            return f"not tested (arm {arm} not in the grid)"
        if not evals_of(results, arm):
            return f"not tested (no evaluation of {'the warm start' if arm == WARM else 'arm ' + arm} yet)"
    return None


def _evidence(name: str, d: Diff) -> str:
    return f"{name} = {format_interval(d)} over {d[3]} tasks"


def _controls(results: Results, h: Hypothesis, boot: Boot, setting: str) -> tuple[list[str], bool] | str:
    """The controls' evidence and whether every one met its prediction; a required one without data: why untested."""
    parts, met = [], True
    present = [c for c in h.controls if c.required or c.a == WARM or c.a in results.experiment.arms]
    for c in present:
        d, name = diff(results, c, boot, setting), _named(results, c, setting)
        if d is None and c.required:
            return f"not tested ({_no_data(results, c, name)})"
        parts.append(_evidence(name, d) if d else _no_data(results, c, name))
        met = met and d is not None and PREDICTIONS[str(c.predict)][0](d[1], d[2])
    if h.controls and not present:
        arms = ", ".join(dict.fromkeys(c.a for c in h.controls))
        parts.append(f"no control arm ({arms}) in the grid: only the {_name(h.compare[0].a)} condition applies")
    return parts, met


def _precondition(results: Results, h: Hypothesis, boot: Boot) -> str | None:
    """Why the hypothesis cannot be decided (its precondition's mean difference is short), or ``None``."""
    if h.precondition is None:
        return None
    pre = dict(h.precondition)
    need = float(pre.pop("at_least"))
    c = Comparison(**pre)
    d = diff(results, c, boot)
    if d is None or d[0] < need:
        shown = _evidence(_named(results, c, NONE), d) if d else _no_data(results, c, _named(results, c, NONE))
        return f"not decidable ({shown}, short of the {need:g} it needs)"
    return None


def judge_one(results: Results, h: Hypothesis, boot: Boot) -> Verdict:
    """The verdict on one declared hypothesis (the rules in the module docstring)."""
    rule = h.explain or explain(h)
    untested = _untested(results, h) or _precondition(results, h, boot)
    if untested:
        return Verdict(h.name, h.statement, untested, "", rule)
    setting = NONE
    if any(c.setting == "best" for c in (*h.compare, *h.controls)):
        best = best_gain(results, h.compare[0].a, boot)
        if best is None:
            return Verdict(
                h.name, h.statement, f"not tested (no rehearsal setting besides none for {h.compare[0].a})", "", rule
            )
        setting = best[0]
    diffs = [(_named(results, c, setting), diff(results, c, boot, setting)) for c in h.compare]
    missing = next(((c, name) for c, (name, d) in zip(h.compare, diffs, strict=True) if d is None), None)
    if missing:
        unshared = _unshared(results, missing[0])
        why = f"{missing[1]}: {unshared}" if unshared else f"no shared evaluated tasks for {missing[1]}"
        return Verdict(h.name, h.statement, f"not tested ({why})", "", rule)
    controls = _controls(results, h, boot, setting)
    if isinstance(controls, str):
        return Verdict(h.name, h.statement, controls, "", rule)
    per_seed = [seed_differences(results, c) if c.metric == "success" and c.a != WARM else [] for c in h.compare]
    parts = [_evidence(name, d) for name, d in diffs if d]
    parts += [_seeds_evidence(name, s) for (name, _), s in zip(diffs, per_seed, strict=True) if s] + controls[0]
    runs = [r for r in results.runs if r.arm in h.zero_env_calls]
    if h.zero_env_calls and not runs:
        return Verdict(h.name, h.statement, f"not tested (no run results of {', '.join(h.zero_env_calls)})", "", rule)
    if runs:
        arms = ", ".join(h.zero_env_calls)
        parts.append(f"{arms} env_calls per run: " + ", ".join(f"s{r.seed}: {r.cost['env_calls']}" for r in runs))
        if any(r.cost["env_calls"] for r in runs):
            why = f" (the {arms} runs called the environment: not zero-call RL)"
            return Verdict(h.name, h.statement, CONTRADICTED, "; ".join(parts) + why, rule)
    if any(d[2] < h.fails for _, d in diffs if d):
        return Verdict(h.name, h.statement, CONTRADICTED, "; ".join(parts), rule)
    seeds_agree = not h.every_seed or all(d > h.floor for s in per_seed for _, d in s)
    supported = all(d[1] > h.floor for _, d in diffs if d) and controls[1] and seeds_agree
    return Verdict(h.name, h.statement, SUPPORTED if supported else INCONCLUSIVE, "; ".join(parts), rule)


def judge(results: Results, boot: Boot) -> list[Verdict]:
    """The verdicts on the hypotheses ``experiment.json`` declares, in their order."""
    return [judge_one(results, h, boot) for h in parse(results.experiment.hypotheses, "experiment.json hypotheses")]


def explain(h: Hypothesis) -> str:
    """The rule of a hypothesis in words, written from its fields."""
    which = "the interval" if len(h.compare) == 1 else "every interval"
    lines = f"supported if {which} of {', '.join(label(c, c.setting) for c in h.compare)} has lo > {h.floor:g}"
    if h.every_seed:
        lines += f" and every seed's own difference is above {h.floor:g}"
    if h.controls:
        predicted = ", ".join(f"{label(c, c.setting)} {PREDICTIONS[str(c.predict)][1]}" for c in h.controls)
        lines += f" and every control in the grid meets its prediction ({predicted})"
    lines += f"; contradicted (checked first) if any has hi < {h.fails:g}"
    if h.zero_env_calls:
        lines += f" or any {', '.join(h.zero_env_calls)} run has env_calls > 0"
    lines += "; otherwise inconclusive"
    if h.precondition:
        pre = h.precondition
        lines += f"; decidable only if the mean of {pre['a']} − {pre.get('b', WARM)} is at least {pre['at_least']:g}"
    return lines
