"""The report of a drift experiment (``evaluation.drift``, often with ``policies_from``): ``report.md``.

Everything comes from result files: this folder's (every policy under every drift, one file each) and,
for the unseen-class table, the evaluations of the experiment whose policies it evaluates
(``policies_from.results`` in ``experiment.json``, relative to this folder), with the API classes of
every task that ``experiment.json`` records. Intervals are the main report's (:class:`Boot`: a task
bootstrap with seeds within tasks, one fixed generator seed): rendering twice gives the same bytes.

Sections: the grid; held-out success per policy × drift kind × mode × setting (N private rehearsals,
with and without the mitigation) and its change from no drift; rehearsal fidelity under drift (the
policy's rehearsal of the gold calls, N = 0; its imagination against the committed real responses,
N > 0); the mitigation against none, with its verdict; unseen API classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envace.experiment.fields import Fields, read_json
from envace.experiment.hypotheses import (
    Boot,
    code_cell,
    common_layout,
    format_interval,
    gold_fidelity,
    limit_shares,
    markdown_table,
    no_common_layout,
    pauses_cell,
)
from envace.experiment.results import WARM, Results, evals_of, item_values, load_results
from envace.experiment.results import task_counts as counts_of
from envace.experiment.stats import CONTRADICTED, SUPPORTED, minimum_detectable_difference, verdict

NONE = "none"
REPORT_FILE = "report.md"
METRICS = ("success", "imagined_key_f1")  # the mitigation's gains
Values = dict[str, list[float]]


@dataclass(frozen=True)
class DriftGrid:
    """What ``experiment.json`` of a drift experiment adds: its drifts, whose policies, every task's classes."""

    drifts: list[str]
    source: dict[str, str] | None
    task_classes: dict[str, list[str]]
    train_classes: list[str]


def is_drift_experiment(folder: str | Path) -> bool:
    """Whether ``folder``'s ``experiment.json`` has a drift axis or evaluates another experiment's policies."""
    meta = read_json(Path(folder) / "experiment.json")
    return isinstance(meta, dict) and bool(meta.get("drift") or meta.get("policies_from"))


def load_grid(folder: str | Path) -> DriftGrid:
    """The drift fields of ``experiment.json``, read strictly (a wrong type names the file and field)."""
    file = Path(folder) / "experiment.json"
    f = Fields(read_json(file), file)
    drifts = f.array("drift", lambda v: isinstance(v, str), "a string") if "drift" in f.obj else [NONE]
    source = None
    if f.obj.get("policies_from") is not None:
        src = f.sub("policies_from")
        source = {"name": src.text("name"), "results": src.text("results")}
    classes = f.sub("task_classes").obj if "task_classes" in f.obj else {}
    bad = [k for k, v in classes.items() if not (isinstance(v, list) and all(isinstance(c, str) for c in v))]
    if bad:
        raise f.error(f"task_classes.{bad[0]}", "must be a list of class names")
    train = f.array("train_classes", lambda v: isinstance(v, str), "a string") if "train_classes" in f.obj else []
    return DriftGrid(drifts, source, dict(classes), train)


def _kind_mode(label: str) -> list[str]:
    """A drift label's kind and mode columns: ``rename_keys/silent/seed2`` -> ``rename_keys``, ``silent, seed 2``."""
    if label == NONE:
        return ["none", "—"]
    kind, mode, *seed = label.split("/")
    return [kind, mode + (f", seed {seed[0].removeprefix('seed')}" if seed else "")]


def _policies(arms: list[str]) -> list[tuple[str, str]]:
    return [("warm start", WARM)] + [(arm, arm) for arm in arms]


def _pooled_gain(
    results: Results, arms: list[str], drifts: list[str], metric: str, mitigated: str, base: str, boot: Boot
) -> tuple[float, float, float, int, int] | None:
    """``mitigated − base`` over several policies and drifts, clustered by task: a task's (policy, drift)
    cells are one unit of the bootstrap (the same task under eleven drifts is nearly one episode eleven
    times, not eleven samples). Each cell is the paired difference of its seed means; the result is
    ``(mean over tasks of the mean over its cells, lo, hi, tasks, cells)``, ``None`` without a paired cell."""
    splits = results.experiment.splits
    cells: Values = {}
    for arm in arms:
        for d in drifts:
            a = item_values(results, arm, metric, splits, mitigated, d)
            b = item_values(results, arm, metric, splits, base, d)
            for k in sorted(set(a) & set(b)):
                cells.setdefault(k, []).append(sum(a[k]) / len(a[k]) - sum(b[k]) / len(b[k]))
    interval = boot.mean(cells)
    return None if interval is None else (*interval, len(cells), sum(map(len, cells.values())))


def _header(results: Results, grid: DriftGrid, source: Results | None) -> list[str]:
    exp = results.experiment
    counts = counts_of(results)
    have = {(e.policy, e.drift) for e in results.evals}
    names = [WARM] + [f"{a}-s{s}" for s in exp.seeds for a in exp.arms]
    missing = [f"eval-{p}-{d.replace('/', '-')}" for d in grid.drifts for p in names if (p, d) not in have]
    seconds = sum(e.seconds for e in results.evals)
    origin = f"`{grid.source['name']}` (`{grid.source['results']}`)" if grid.source else "this grid's own runs"
    rows = [
        ["policies evaluated", f"warm start, {', '.join(exp.arms)} × seeds {', '.join(map(str, exp.seeds))}"],
        ["trained by", origin],
        ["drifts", ", ".join(grid.drifts)],
        ["settings", ", ".join(exp.settings)],
        ["splits (evaluated tasks)", ", ".join(f"{s} ({counts.get(s, 0)})" for s in exp.splits)],
        ["units read", str(len(results.evals))],
        ["units missing", ", ".join(missing) or "none"],
        ["code (git commit: units)", code_cell(results)],
        ["compute (sum of unit seconds, less pauses)", f"{seconds:.1f} s ({seconds / 3600:.2f} h)"],
        ["pauses (pauses.json)", pauses_cell(results)],
    ]
    rows.append(["minimum detectable difference (success, one policy, a drift against none)", _mdd(results)])
    if source is not None:
        rows.append(["no drift, setting none: verdicts equal to the trained grid's", _agreement(results, source)])
    return [f"# Drift experiment `{exp.name}`", "", "## Grid", "", *markdown_table(["", ""], rows), ""]


def _mdd(results: Results) -> str:
    """The smallest change of one policy's success a drift could be seen to cause, stated before the results:
    :func:`minimum_detectable_difference` at the policies' mean success without drift (setting ``none``)
    and at 0.5, with this grid's tasks and seeds."""
    exp = results.experiment
    base = [
        v for arm in [WARM, *exp.arms] for vs in item_values(results, arm, "success", exp.splits).values() for v in vs
    ]
    n = sum(counts_of(results).get(s, 0) for s in exp.splits)
    if not base or n == 0:
        return "—"
    p = sum(base) / len(base)
    at = [f"{minimum_detectable_difference(q, n, len(exp.seeds)):.3f} at p = {q:.3f}" for q in (p, 0.5)]
    return f"{at[0]} (mean success without drift), {at[1]}; n = {n} tasks, k = {len(exp.seeds)} seed(s)"


def _agreement(results: Results, source: Results) -> str:
    """Items of this grid (no drift, setting ``none``) whose official verdict equals the source's on the
    same policy and task: the same weights and code give the same verdict."""
    theirs = {
        (e.policy, it.split, it.task_id): it.success
        for e in source.evals
        if e.drift == NONE
        for it in e.items
        if it.setting == NONE
    }
    pairs = [
        (it.success, theirs[(e.policy, it.split, it.task_id)])
        for e in results.evals
        if e.drift == NONE
        for it in e.items
        if it.setting == NONE and (e.policy, it.split, it.task_id) in theirs
    ]
    return f"{sum(a == b for a, b in pairs)} of {len(pairs)} items" if pairs else "no shared item"


def _success_section(results: Results, grid: DriftGrid, boot: Boot) -> list[str]:
    exp = results.experiment
    splits, rows = exp.splits, []
    for label, arm in _policies(exp.arms):
        base = item_values(results, arm, "success", splits, NONE, NONE)
        for d in grid.drifts:
            cells = [
                format_interval(boot.mean(item_values(results, arm, "success", splits, s, d))) for s in exp.settings
            ]
            plain = item_values(results, arm, "success", splits, NONE, d)
            change = "—" if d == NONE else format_interval(boot.diff(plain, base))
            ended = [
                limit_shares([it for e in evals_of(results, arm, d) for it in e.items if it.setting == s])
                for s in exp.settings
            ]
            rows.append([label, *_kind_mode(d), *cells, change, *ended])
    header = [
        "policy",
        "drift",
        "mode",
        *(f"success {s}" for s in exp.settings),
        "Δ none vs no drift",
        *(f"ended by a limit {s}" for s in exp.settings),
    ]
    return [
        "## Held-out success under drift",
        "",
        "Official success (bfcl-eval's checker on the canonical calls of the committed episode against the "
        "drifted real environment) pooled over the splits, per setting (`none`: N = 0; `mode@N`: N private "
        "rehearsals per user turn; `+reimagine<k>`: with the mitigation). Each cell is `mean [lo, hi]`: the "
        f"mean over tasks of the per-task mean over seeds, with a {boot.n_boot}-replicate 95% bootstrap interval "
        f"(tasks, then seeds within each; generator seed {boot.seed}). Δ: success under the drift − without, "
        "setting `none`, paired by task. Ended by a limit: committed attempts / imagined attempts that a rollout "
        "limit ended (`max_steps`, `max_episode_tokens`, `truncated`, ...), of those recorded (— in files "
        "without flags).",
        "",
        *markdown_table(header, rows),
        "",
    ]


def _fidelity_section(results: Results, grid: DriftGrid, boot: Boot) -> list[str]:
    exp = results.experiment
    imagined = [s for s in exp.settings if s != NONE]
    evals = [e for _, arm in _policies(exp.arms) for d in grid.drifts for e in evals_of(results, arm, d)]
    layout = common_layout(evals)
    rows = []
    for label, arm in _policies(exp.arms):
        for d in grid.drifts:
            cells = [
                format_interval(boot.mean(gold_fidelity(results, arm, m, layout, d))) for m in ("value_f1", "key_f1")
            ]
            for s in imagined:
                cells += [
                    format_interval(boot.mean(item_values(results, arm, f"imagined_{m}", exp.splits, s, d)))
                    for m in ("value_f1", "key_f1")
                ]
            rows.append([label, *_kind_mode(d), *cells])
    header = [
        "policy",
        "drift",
        "mode",
        f"gold value_f1 (N = 0, {layout or 'no common'} layout)",
        f"gold key_f1 (N = 0, {layout or 'no common'} layout)",
        *(f"{s} imagined {m}" for s in imagined for m in ("value_f1", "key_f1")),
    ]
    return [
        "## Rehearsal fidelity under drift",
        "",
        "N = 0: the policy's rehearsal of the gold calls (the oracle acts, the policy writes every response, the "
        "drifted environment answers in lockstep), in the gold layout named, one every evaluation of the table "
        "holds (`call`: one gold call an act step, as training episodes are laid out; `turn`: a turn's calls in "
        "one step). N > 0: the imagination against the committed episode: each "
        "committed call's real (drifted) response against the response the latest imagination before it "
        "rehearsed for that tool (its arguments first); calls never rehearsed are left out. key_f1 measures the "
        "shape (drift renames, nests and adds keys), value_f1 the values.",
        "",
        *markdown_table(header, rows),
        "",
        *([f"Gold fidelity (N = 0): {no_common_layout(evals)}.", ""] if layout is None else []),
    ]


def _mitigation_pairs(settings: list[str]) -> list[tuple[str, str]]:
    """``(setting, the same setting with the mitigation)`` pairs of the grid's settings."""
    return [(s.split("+")[0], s) for s in settings if "+reimagine" in s and s.split("+")[0] in settings]


def _mitigation_section(results: Results, grid: DriftGrid, boot: Boot) -> list[str]:
    exp = results.experiment
    title = ["## Mitigation: re-imagining after an unforeseen real response", ""]
    pairs = _mitigation_pairs(exp.settings)
    if not pairs:
        return [*title, "No mitigated setting in this grid (`evaluation.reimagine: [0]`).", ""]
    everyone, drifted = [WARM, *exp.arms], [d for d in grid.drifts if d != NONE]
    pooled = ["all drifts", "—"]
    groups = [(label, [arm], [d], _kind_mode(d)) for label, arm in _policies(exp.arms) for d in grid.drifts]
    groups += [(label, [arm], drifted, pooled) for label, arm in _policies(exp.arms)]
    groups += [("all", everyone, drifted, pooled), ("all", everyone, [NONE], _kind_mode(NONE))]
    rows, verdicts = [], []
    for base, mitigated in pairs:
        for label, arms, drifts, name in groups:
            if not drifts or not set(drifts) <= set(grid.drifts):
                continue
            gains = [_pooled_gain(results, arms, drifts, m, mitigated, base, boot) for m in METRICS]
            rows.append([label, *name, f"{mitigated} − {base}", *(format_interval(g and g[:3]) for g in gains)])
        overall = _pooled_gain(results, everyone, drifted, "success", mitigated, base, boot)
        verdicts.append(f"- **{mitigated} against {base}**, under drift, every policy: {_keep(overall)}.")
    header = ["policy", "drift", "mode", "settings", "success gain", "imagined key_f1 gain"]
    return [
        *title,
        "The mitigation (`ImaginationConfig.reimagine`): once an act step's calls are answered, if a real response "
        "has a shape the latest imagined attempts did not rehearse for its tool (other keys, an error, another "
        "type), the rest of the turn is imagined again from the committed context, which now holds the real "
        "responses. Gain = mitigated − not, paired by (policy, drift, task); the interval resamples task families "
        "(a BFCL scenario's categories together), then the (policy, drift) cells of each (a task's cells are one "
        "cluster: the same task under every drift is nearly the same episode again). The verdict rests on the "
        "pooled success gain under drift: kept only if "
        "its interval lies above 0.",
        "",
        *markdown_table(header, rows),
        "",
        *verdicts,
        "",
    ]


def _keep(gain: tuple[float, float, float, int, int] | None) -> str:
    """The verdict on the mitigation from its pooled success gain (:func:`_pooled_gain`)."""
    if gain is None:
        return "not measured (no shared items)"
    v = verdict(gain[1], gain[2], ">")
    what = {SUPPORTED: "it helps: keep it", CONTRADICTED: "it hurts: drop it"}.get(
        v, "no effect detected at this scale: not kept (it costs imagination)"
    )
    cells = f"{gain[4]} paired (policy, drift, task) cells"
    return f"gain {format_interval(gain[:3])} over {gain[3]} tasks ({cells}), {what}"


def _unseen_section(grid: DriftGrid, source: Results | None, boot: Boot) -> list[str]:
    title = ["## Unseen API classes", ""]
    if source is None:
        return [*title, "The trained grid's results are not available (`policies_from.results`).", ""]
    exp = source.experiment
    policies = _policies(exp.arms)
    test = {label: item_values(source, arm, "success", ["test"]) for label, arm in policies}
    keys = sorted({k for v in test.values() for k in v})
    unknown = [k for k in keys if k not in grid.task_classes]
    classes = sorted(
        {c for k in keys for c in grid.task_classes.get(k, [])}, key=lambda c: (c in grid.train_classes, c)
    )
    rows = []
    for c in classes:
        members = {k for k in keys if c in grid.task_classes.get(k, [])}
        cells = [
            format_interval(boot.mean({k: v for k, v in test[label].items() if k in members})) for label, _ in policies
        ]
        rows.append([c, "yes" if c not in grid.train_classes else "no", str(len(members)), *cells])
    val = {label: item_values(source, arm, "success", ["val"]) for label, arm in policies}
    for name, split in (("test: all", test), ("val: training classes", val)):
        n = len({k for v in split.values() for k in v})
        rows.append([name, "—", str(n), *(format_interval(boot.mean(split[label])) for label, _ in policies)])
    note = f" {len(unknown)} evaluated task(s) had no recorded classes and are left out." if unknown else ""
    return [
        *title,
        f"From the evaluations of `{exp.name}` (no drift, setting `none`, its seeds): official success on its "
        "`test` split, the scenarios that involve an API class never trained on, per class (a task counts in "
        "every class it involves; held out = not among the training classes "
        f"{', '.join(grid.train_classes) or '—'}), beside its `val` split (unseen scenarios of the training "
        f"classes).{note}",
        "",
        *markdown_table(["API class", "held out", "tasks", *(label for label, _ in policies)], rows),
        "",
    ]


def render_drift_report(
    results: Results, grid: DriftGrid, source: Results | None, n_boot: int = 2000, seed: int = 0
) -> str:
    """The markdown text of a drift experiment's ``report.md``: a function of its inputs only."""
    boot = Boot(n_boot, seed)
    sections = [
        _header(results, grid, source),
        _success_section(results, grid, boot),
        _fidelity_section(results, grid, boot),
        _mitigation_section(results, grid, boot),
        _unseen_section(grid, source, boot),
    ]
    return "\n".join(line for section in sections for line in section).rstrip("\n") + "\n"


def load_source_results(folder: Path, grid: DriftGrid) -> Results | None:
    """The results of the experiment whose policies ``folder``'s grid evaluates, ``None`` when it has none here."""
    if grid.source is None:
        return None
    path = folder / grid.source["results"]
    return load_results(path) if (path / "experiment.json").is_file() else None


def write_drift_report(folder: str | Path, n_boot: int = 2000, seed: int = 0) -> Path:
    """Read a drift experiment's result files (and its source's) and write ``report.md``; returns its path."""
    folder = Path(folder)
    results, grid = load_results(folder), load_grid(folder)
    text = render_drift_report(results, grid, load_source_results(folder, grid), n_boot, seed)
    path = folder / REPORT_FILE
    path.write_text(text, encoding="utf-8")
    return path
