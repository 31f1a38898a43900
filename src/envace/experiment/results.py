"""The result files of an experiment, read strictly, and the per-task values the report is made of.

``<folder>/experiment.json`` holds the grid; every finished unit wrote one ``<folder>/units/*.json``
(kinds ``warm_start``, ``run``, ``eval``; the fields are those of the dataclasses below). A file that
is not valid JSON, misses a field or holds a value of the wrong type raises ``ValueError`` naming the
file and the field. Integers are accepted where a float is expected; booleans never count as numbers.
A unit's ``seconds`` are read less its pause in ``pauses.json`` (:mod:`envace.experiment.pauses`).

Per-task values are keyed ``"<split>/<task_id>"`` (tasks of two splits never merge) and list one
value per seed, in seed order, so the bootstrap sees the same input however the files were written.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envace.experiment.fields import Fields, is_int, is_number, read_json
from envace.experiment.pauses import Pause, less_pause, read_pauses

WARM = "warm_start"
NONE = "none"  #: the setting without rehearsal, and the drift of an undrifted evaluation
PerTask = dict[str, list[float]]  #: task key -> one value per seed


@dataclass(frozen=True)
class Experiment:
    """The grid of ``experiment.json``."""

    name: str
    arms: list[str]
    seeds: list[int]
    reference_arm: str
    splits: list[str]
    settings: list[str]
    hypotheses: list[Any]  #: the declarations :mod:`~envace.experiment.judge` judges


@dataclass(frozen=True)
class WarmStart:
    """The shared grounded warm start."""

    seconds: float
    steps: int
    fingerprint: str


@dataclass(frozen=True)
class Run:
    """One RL run of an arm; ``cost`` has ``act_tokens, rehearse_tokens, env_calls, generated_tokens``."""

    arm: str
    seed: int
    seconds: float
    steps: int
    cost: dict[str, int]
    curves: dict[str, list[tuple[int, float]]]


@dataclass(frozen=True)
class Item:
    """One evaluated task under one rehearsal setting; ``imagined_*``: the imagination's fidelity to
    the committed real responses (``None`` without rehearsal, or in files that predate it);
    ``flags``: the limits that ended the committed episode, ``imagined_flags`` each imagined
    attempt's (``None`` in files that predate them)."""

    split: str
    task_id: str
    setting: str
    n: int
    mode: str
    success: bool
    score: float | None
    turn_score: float | None
    imagined_value_f1: float | None = None
    imagined_key_f1: float | None = None
    flags: tuple[str, ...] | None = None
    imagined_flags: tuple[tuple[str, ...], ...] | None = None


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


@dataclass(frozen=True)
class Fidelity:
    """Rehearsal fidelity of the policy on one task's gold calls (``None`` when it had no pairs), the
    oracle laying them out as ``layout`` (``evaluation.gold_layouts``; ``turn`` in files written before it)."""

    split: str
    task_id: str
    pairs: int
    value_f1: float | None
    key_f1: float | None
    json_valid: float | None
    error_agreement: float | None
    decision_f1: float | None = None  # absent from result files written before it existed
    layout: str = "turn"


@dataclass(frozen=True)
class Eval:
    """The evaluation of one policy: the warm start (``arm == policy == "warm_start"``) or a run's final
    one, under ``drift`` (a drift label, ``none`` in files without one)."""

    policy: str
    arm: str
    seed: int | None
    seconds: float
    items: list[Item]
    fidelity: list[Fidelity]
    drift: str = "none"


@dataclass(frozen=True)
class Results:
    """Everything the report reads: the grid and the finished units (sorted by arm, then seed)."""

    experiment: Experiment
    warm_start: WarmStart | None
    runs: list[Run]
    evals: list[Eval]
    codes: dict[str, int] = field(default_factory=dict)  #: :func:`code_label` -> units that ran that code
    pauses: dict[str, Pause] = field(default_factory=dict)  #: unit key -> seconds left out of its own, and why
    notes: str = ""  #: ``notes.md`` of the folder, hand-written (what a later grid changed, and why)


def _experiment(f: Fields) -> Experiment:
    hypotheses = f.obj.get("hypotheses") or []
    if not isinstance(hypotheses, list):
        raise f.error("hypotheses", f"must be a list of declarations, got {type(hypotheses).__name__}")
    return Experiment(
        name=f.text("name"),
        arms=f.array("arms", lambda v: isinstance(v, str), "a string"),
        seeds=f.array("seeds", is_int, "an integer"),
        reference_arm=f.text("reference_arm"),
        splits=f.array("splits", lambda v: isinstance(v, str), "a string"),
        settings=f.array("settings", lambda v: isinstance(v, str), "a string"),
        hypotheses=hypotheses,
    )


def _curves(f: Fields) -> dict[str, list[tuple[int, float]]]:
    def is_point(p: Any) -> bool:
        return isinstance(p, list) and len(p) == 2 and is_int(p[0]) and is_number(p[1])

    return {tag: [(p[0], float(p[1])) for p in f.array(tag, is_point, "a [step, value] pair")] for tag in sorted(f.obj)}


def _run(f: Fields) -> Run:
    cost = f.sub("cost")
    keys = ("act_tokens", "rehearse_tokens", "env_calls", "generated_tokens")
    return Run(
        arm=f.text("arm"),
        seed=f.integer("seed"),
        seconds=f.real("seconds"),
        steps=f.integer("steps"),
        cost={k: cost.integer(k) for k in keys},
        curves=_curves(f.sub("curves")),
    )


def _item(f: Fields) -> Item:
    success = f.get("success", lambda v: isinstance(v, bool), "a boolean")
    return Item(
        split=f.text("split"),
        task_id=f.text("task_id"),
        setting=f.text("setting"),
        n=f.integer("n"),
        mode=f.text("mode"),
        success=success,
        score=f.number("score", optional=True),
        turn_score=f.number("turn_score", optional=True),
        imagined_value_f1=f.maybe_number("imagined_value_f1"),
        imagined_key_f1=f.maybe_number("imagined_key_f1"),
        flags=tuple(f.array("flags", lambda v: isinstance(v, str), "a string")) if "flags" in f.obj else None,
        imagined_flags=tuple(tuple(a) for a in f.array("imagined_flags", _strings, "a list of strings"))
        if "imagined_flags" in f.obj
        else None,
    )


def _fidelity(f: Fields) -> Fidelity:
    return Fidelity(
        split=f.text("split"),
        task_id=f.text("task_id"),
        pairs=f.integer("pairs"),
        value_f1=f.number("value_f1", optional=True),
        key_f1=f.number("key_f1", optional=True),
        json_valid=f.number("json_valid", optional=True),
        error_agreement=f.number("error_agreement", optional=True),
        decision_f1=f.maybe_number("decision_f1"),
        layout=f.text("layout") if "layout" in f.obj else "turn",
    )


def _eval(f: Fields) -> Eval:
    items = f.array("items", lambda v: isinstance(v, dict), "an object")
    fidelity = f.array("fidelity", lambda v: isinstance(v, dict), "an object")
    policy, arm = f.text("policy"), f.text("arm")
    if (policy == WARM) != (arm == WARM):
        raise f.error(
            "arm", f"is {arm!r}: the policy 'warm_start' and the arm 'warm_start' go together (policy {policy!r})"
        )
    return Eval(
        policy=policy,
        arm=arm,
        seed=f.integer("seed", optional=True),
        seconds=f.real("seconds"),
        items=[_item(Fields(o, f.file, f"items[{i}].")) for i, o in enumerate(items)],
        fidelity=[_fidelity(Fields(o, f.file, f"fidelity[{i}].")) for i, o in enumerate(fidelity)],
        drift=f.text("drift") if "drift" in f.obj else "none",
    )


def _unit(file: Path) -> tuple[str, WarmStart | Run | Eval]:
    f = Fields(read_json(file), file)
    unit, kind = f.text("unit"), f.text("kind")
    if kind == WARM:
        return unit, WarmStart(seconds=f.real("seconds"), steps=f.integer("steps"), fingerprint=f.text("fingerprint"))
    if kind == "run":
        return unit, _run(f)
    if kind == "eval":
        return unit, _eval(f)
    raise f.error("kind", f"must be 'warm_start', 'run' or 'eval', got {kind!r}")


def _identity(record: WarmStart | Run | Eval) -> str:
    """What one unit measures; two files measuring the same thing are an error."""
    if isinstance(record, WarmStart):
        return "the warm start"
    if isinstance(record, Run):
        return f"the run of arm {record.arm!r} seed {record.seed}"
    return f"the evaluation of policy {record.policy!r}" + (f" under drift {record.drift!r}" * (record.drift != "none"))


def load_results(folder: str | Path) -> Results:
    """Read ``experiment.json`` and every ``units/*.json`` of an experiment folder.

    Args:
        folder: the experiment folder.

    Raises:
        ValueError: a malformed file (named, with its field), two files of one unit, or two warm starts.
    """
    folder = Path(folder)
    experiment = _experiment(Fields(read_json(folder / "experiment.json"), folder / "experiment.json"))
    warm: list[WarmStart] = []
    runs: list[Run] = []
    evals: list[Eval] = []
    seen: dict[str, Path] = {}
    codes: Counter[str] = Counter()
    pauses = read_pauses(folder)
    for file in sorted((folder / "units").glob("*.json")):
        unit, record = _unit(file)
        record = replace(record, seconds=less_pause(unit, record.seconds, pauses, file))
        codes[code_label(read_json(file).get("code"))] += 1
        for key in (unit, _identity(record)):
            if key in seen:
                raise ValueError(f"{file}: field 'unit' {unit!r}: {key} was already read from {seen[key].name}")
            seen[key] = file
        if isinstance(record, WarmStart):
            warm.append(record)
        elif isinstance(record, Run):
            runs.append(record)
        else:
            evals.append(record)
    runs.sort(key=lambda r: (r.arm, r.seed))
    evals.sort(key=lambda e: (e.arm, -1 if e.seed is None else e.seed, e.policy))
    notes = (folder / "notes.md").read_text(encoding="utf-8").strip() if (folder / "notes.md").is_file() else ""
    return Results(experiment, warm[0] if warm else None, runs, evals, dict(codes), pauses, notes)


def code_label(code: Any) -> str:
    """A result file's ``code`` (:func:`envace.evaluation.provenance.git_commit`): ``commit[:12]``, with
    ``+dirty`` when tracked files differed; ``unrecorded`` without one.
    >>> code_label({"commit": "919daaf4bd2e0123", "dirty": True}), code_label(None)
    ('919daaf4bd2e+dirty', 'unrecorded')
    """
    if not isinstance(code, dict) or not isinstance(code.get("commit"), str):
        return "unrecorded"
    return code["commit"][:12] + ("+dirty" if code.get("dirty") else "")


def evals_of(results: Results, arm: str, drift: str = "none") -> list[Eval]:
    """The evaluations of an arm's final policies (``"warm_start"``: the warm start's) under a drift, by seed."""
    return [e for e in results.evals if e.arm == arm and e.drift == drift]


def _per_task(e: Eval, values: Callable[[Eval], Iterable[tuple[str, float]]]) -> dict[str, float]:
    """``{task key: value}`` of one evaluation; several values of one task are averaged."""
    per_task: dict[str, list[float]] = defaultdict(list)
    for key, value in values(e):
        per_task[key].append(value)
    return {key: sum(vs) / len(vs) for key, vs in per_task.items()}


def _collect(evals: Iterable[Eval], values: Callable[[Eval], Iterable[tuple[str, float]]]) -> dict[str, list[float]]:
    """``{task key: [one value per evaluation]}``; several values of one task in one evaluation are averaged."""
    out: dict[str, list[float]] = defaultdict(list)
    for e in evals:
        for key, value in _per_task(e, values).items():
            out[key].append(value)
    return dict(out)


def _item_metric(metric: str, splits: Iterable[str], setting: str) -> Callable[[Eval], Iterable[tuple[str, float]]]:
    """An evaluation's ``(task key, value)`` of an item metric under one setting; null values are skipped."""
    wanted = set(splits)

    def values(e: Eval) -> Iterable[tuple[str, float]]:
        for it in e.items:
            value = getattr(it, metric)
            if it.split in wanted and it.setting == setting and value is not None:
                yield f"{it.split}/{it.task_id}", float(value)

    return values


def eval_item_values(e: Eval, metric: str, splits: Iterable[str], setting: str = "none") -> dict[str, float]:
    """``{task key: value}`` of one evaluation (one seed) for an item metric, as :func:`item_values` reads it."""
    return _per_task(e, _item_metric(metric, splits, setting))


def item_values(
    results: Results, arm: str, metric: str, splits: Iterable[str], setting: str = "none", drift: str = "none"
) -> dict[str, list[float]]:
    """Per-task values of one arm (or the warm start) for an item metric.

    Args:
        results: the loaded results.
        arm: an arm, or ``"warm_start"``.
        metric: ``"success"`` (as 0/1), ``"score"`` or ``"turn_score"``; null values are skipped.
        splits: the splits pooled.
        setting: the rehearsal setting (``"none"``, ``"parallel@2"``, ...).
        drift: the drift of the evaluations (``"none"``, ``"rename_keys/silent"``, ...).
    """
    return _collect(evals_of(results, arm, drift), _item_metric(metric, splits, setting))


def paired_item_values(
    results: Results,
    arm: str,
    metric: str,
    splits: Iterable[str],
    setting: str,
    baseline: str = NONE,
    drift: str = NONE,
) -> tuple[PerTask, PerTask]:
    """:func:`item_values` of ``setting`` and of ``baseline`` on the task × seed cells both have, seeds in
    the same order: a setting evaluated on some seeds only (``evaluation.rehearsal_seeds``) is compared
    with its baseline on those seeds. Where every evaluation holds both, the two are :func:`item_values`'."""
    mine, theirs = _item_metric(metric, splits, setting), _item_metric(metric, splits, baseline)
    a: dict[str, list[float]] = defaultdict(list)
    b: dict[str, list[float]] = defaultdict(list)
    for e in evals_of(results, arm, drift):
        with_setting, base = _per_task(e, mine), _per_task(e, theirs)
        for key in (k for k in with_setting if k in base):
            a[key].append(with_setting[key])
            b[key].append(base[key])
    return dict(a), dict(b)


def seeds_with(results: Results, arm: str, settings: Iterable[str], drift: str = "none") -> list[int | None]:
    """The seeds of an arm's evaluations that hold an item of any of ``settings`` (the warm start's: ``None``)."""
    wanted = set(settings)
    return [e.seed for e in evals_of(results, arm, drift) if any(it.setting in wanted for it in e.items)]


def fidelity_values(
    results: Results, arm: str, splits: Iterable[str], metric: str = "value_f1", drift: str = "none", *, layout: str
) -> dict[str, list[float]]:
    """Per-task gold-call fidelity of one arm (or the warm start) in one gold ``layout`` (two layouts of
    a task never merge); tasks without pairs are skipped."""
    wanted = set(splits)

    def values(e: Eval) -> Iterable[tuple[str, float]]:
        for fid in e.fidelity:
            value = getattr(fid, metric)
            if fid.split in wanted and fid.layout == layout and value is not None:
                yield f"{fid.split}/{fid.task_id}", float(value)

    return _collect(evals_of(results, arm, drift), values)


def task_keys(results: Results) -> dict[str, set[str]]:
    """Distinct evaluated task keys (``split/task_id``) per split of the grid (over every evaluation and setting)."""
    tasks: dict[str, set[str]] = {s: set() for s in results.experiment.splits}
    for e in results.evals:
        for it in e.items:
            tasks.setdefault(it.split, set()).add(f"{it.split}/{it.task_id}")
    return tasks


def task_counts(results: Results) -> dict[str, int]:
    """Distinct evaluated tasks per split of the grid (over every evaluation and setting)."""
    return {s: len(ts) for s, ts in task_keys(results).items()}
