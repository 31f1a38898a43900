"""The report of ``envace experiment``: ``<folder>/report.md`` and ``<folder>/figures/*.png``.

Everything comes from the result files (:mod:`envace.experiment.results`) and nothing else: no wall
clock, no environment, every bootstrap with one fixed seed. Rendering the same files twice gives the
same ``report.md`` byte for byte; the figures are only linked from it.

Order of the report: the grid and its compute, the minimum detectable difference (before any result),
the main table and the differences to the reference arm and to the warm start, by stratum where task
ids name one (:mod:`envace.experiment.strata`), each run's final
policy against the warm start task by task, the training per arm (:mod:`envace.experiment.training_table`),
the cost of RL per arm, private rehearsal, the verdicts on H1–H4 with the rule of each, the figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from envace.experiment.figures import figures_of, write_figures
from envace.experiment.hypotheses import (
    NONE,
    Boot,
    arms_layout,
    best_gain,
    code_cell,
    family_count,
    fmt,
    format_interval,
    gold_fidelity,
    limit_shares,
    markdown_table,
    no_common_layout,
    pauses_cell,
    rehearsal_success,
    success,
)
from envace.experiment.judge import judge
from envace.experiment.results import (
    WARM,
    Results,
    evals_of,
    item_values,
    load_results,
    seeds_with,
    task_counts,
    task_keys,
)
from envace.experiment.stats import minimum_detectable_difference
from envace.experiment.strata import strata_section
from envace.experiment.training_table import against_warm_start_section, training_section

__all__ = ["load_results", "main_table", "policies", "render_report", "write_report"]

REPORT_FILE = "report.md"
ALPHA, POWER = 0.05, 0.8


def policies(results: Results) -> list[tuple[str, str]]:
    """``(row label, arm)`` of the report's rows: the warm start, then the grid's arms."""
    return [("warm start", WARM)] + [(arm, arm) for arm in results.experiment.arms]


def _seconds(x: float) -> str:
    return f"{x:.1f} s ({x / 3600:.2f} h)"


def _missing_units(results: Results) -> list[str]:
    exp = results.experiment
    runs = {(r.arm, r.seed) for r in results.runs}
    evals = {e.policy for e in results.evals}
    missing = [] if results.warm_start else ["warm_start"]
    missing += ["eval-warm_start"] if WARM not in evals else []
    for arm in exp.arms:
        for seed in exp.seeds:
            missing += [] if (arm, seed) in runs else [f"run-{arm}-s{seed}"]
            missing += [] if f"{arm}-s{seed}" in evals else [f"eval-{arm}-s{seed}"]
    return missing


def _header(results: Results) -> list[str]:
    exp = results.experiment
    counts = task_counts(results)
    run_s, eval_s = sum(r.seconds for r in results.runs), sum(e.seconds for e in results.evals)
    warm_s = results.warm_start.seconds if results.warm_start else 0.0
    rows = [
        ["arms", ", ".join(exp.arms)],
        ["reference arm", exp.reference_arm],
        ["seeds", ", ".join(str(s) for s in exp.seeds)],
        ["splits (evaluated tasks)", ", ".join(f"{s} ({counts.get(s, 0)})" for s in exp.splits)],
        ["rehearsal settings", ", ".join(exp.settings)],
        [
            "units read",
            f"warm start {int(results.warm_start is not None)}, runs {len(results.runs)}, "
            f"evaluations {len(results.evals)}",
        ],
        ["units missing", ", ".join(_missing_units(results)) or "none"],
        ["warm-start fingerprint", f"`{results.warm_start.fingerprint}`" if results.warm_start else "—"],
        ["code (git commit: units)", code_cell(results)],
        ["compute (sum of unit seconds, less pauses)", _seconds(warm_s + run_s + eval_s)],
        ["pauses (pauses.json)", pauses_cell(results)],
        ["… warm start / runs / evaluations", f"{_seconds(warm_s)} / {_seconds(run_s)} / {_seconds(eval_s)}"],
    ]
    return [f"# Experiment `{exp.name}`", "", "## Grid", "", *markdown_table(["", ""], rows), ""]


def _mdd_row(label: str, n: int, n_families: int, k: int, p_hat: float | None) -> list[str]:
    if n == 0:
        return [label, "0", "0", str(k), "—", "—", "—", "—"]

    def mdd(p: float, units: int) -> str:
        return fmt(minimum_detectable_difference(p, units, k, ALPHA, POWER))

    if p_hat is None:
        return [label, str(n), str(n_families), str(k), "—", "—", mdd(0.5, n), "—"]
    return [label, str(n), str(n_families), str(k), fmt(p_hat), mdd(p_hat, n), mdd(0.5, n), mdd(p_hat, n_families)]


def _mdd_section(results: Results) -> list[str]:
    exp = results.experiment
    keys = task_keys(results)
    k = max(len(exp.seeds), 1)
    rows = []
    for label, splits in [*((s, [s]) for s in exp.splits), ("pooled", exp.splits)]:
        warm = item_values(results, WARM, "success", splits)
        p_hat = sum(sum(v) / len(v) for v in warm.values()) / len(warm) if warm else None
        tasks = set().union(*(keys.get(s, set()) for s in splits))
        rows.append(_mdd_row(label, len(tasks), family_count(tasks), k, p_hat))
    return [
        "## Minimum detectable difference",
        "",
        "The smallest difference of two official success rates this grid detects, fixed before any arm's result: "
        "`MDD = (z_{1−α/2} + z_{power}) · √(2·p·(1−p) / (n·k))` with α = "
        f"{ALPHA} (two-sided), power = {POWER}, n tasks and k = {k} seeds per arm. p is the warm start's measured "
        "success (setting `none`) and, as the worst case, 0.5. It treats the n·k outcomes as independent; outcomes "
        "of one task are correlated, so the real MDD is larger. So are the outcomes of one family of tasks (the "
        "categories of one BFCL scenario share the first turn's state and, mostly, its question): the last column "
        "counts each family as one unit (n = families), the MDD if a family's tasks always agreed; the real MDD "
        "lies between the two. Every interval of this report resamples families. A difference smaller than this is "
        "not expected to show.",
        "",
        *markdown_table(
            ["tasks", "n", "families", "k", "p (warm start)", "MDD at p", "MDD at p = 0.5", "MDD at p, families"],
            rows,
        ),
        "",
    ]


def main_table(results: Results, boot: Boot) -> list[list[str]]:
    """Rows of the main table: policy, success per split, pooled turn score, pooled gold-call value_f1 in
    the gold layout every row's evaluations hold (``call`` first; none common: ``—``).

    Args:
        results: the loaded results.
        boot: the bootstrap settings.
    """
    splits = results.experiment.splits
    layout, _ = arms_layout(results, [arm for _, arm in policies(results)])
    rows = []
    for label, arm in policies(results):
        cells = [format_interval(boot.mean(item_values(results, arm, "success", [s]))) for s in splits]
        cells.append(format_interval(boot.mean(item_values(results, arm, "turn_score", splits))))
        cells.append(format_interval(boot.mean(gold_fidelity(results, arm, "value_f1", layout))))
        rows.append([label, *cells])
    return rows


def _diff_rows(results: Results, boot: Boot, pairs: list[tuple[str, str, str]]) -> list[list[str]]:
    """One row per ``(label, a, b)``: ``a − b`` in official success per split and pooled, and the tasks paired."""
    exp = results.experiment
    rows = []
    for label, a, b in pairs:
        cells = []
        for splits in [*([s] for s in exp.splits), exp.splits]:
            diff = boot.diff(item_values(results, a, "success", splits), item_values(results, b, "success", splits))
            cells.append(format_interval(diff))
        pooled = boot.diff(success(results, a), success(results, b))
        rows.append([label, *cells, str(pooled[3]) if pooled else "0"])
    return rows


def _results_section(results: Results, boot: Boot) -> list[str]:
    exp = results.experiment
    layout, evals = arms_layout(results, [arm for _, arm in policies(results)])
    fidelity = f"gold-call value_f1 (pooled, {layout} layout)" if layout else "gold-call value_f1 (pooled)"
    header = ["policy", *(f"success {s}" for s in exp.splits), "turn score (pooled)", fidelity]
    diff_header = ["policy", *(f"success {s}" for s in exp.splits), "success pooled", "tasks (pooled)"]
    ref = exp.reference_arm
    to_reference = [(label, ref, arm) for label, arm in policies(results) if arm != ref]
    to_warm = [(arm, arm, WARM) for arm in exp.arms]
    return [
        "## Results",
        "",
        "Official success (the benchmark's checker on committed real execution) and turn score (share of user turns "
        "passed), with no rehearsal (setting `none`); gold-call value_f1 is the fidelity of the policy's own "
        "rehearsal of the gold calls, the oracle writing them in the named gold layout (`call`: one an act step, "
        "as training episodes are laid out; `turn`: a turn's calls in one step), one that every row's evaluations "
        "hold. Each cell is `mean [lo, hi]`: the mean over tasks of the per-task mean over "
        f"seeds and a {boot.n_boot}-replicate 95% percentile bootstrap interval resampling task families (the "
        "categories of one BFCL scenario together; any other task alone), then seeds within each task (generator "
        f"seed {boot.seed}). Pooled: the tasks of all splits together.",
        "",
        *markdown_table(header, main_table(results, boot)),
        "",
        *([f"Gold-call value_f1: {no_common_layout(evals)}.", ""] if layout is None else []),
        f"### Difference to the reference arm ({exp.reference_arm})",
        "",
        f"`{exp.reference_arm} − policy` in official success, paired by task over the tasks both have; the "
        "bootstrap resamples task families and, within each task, the seeds of each side independently.",
        "",
        *markdown_table(diff_header, _diff_rows(results, boot, to_reference)),
        "",
        "### Difference to the warm start",
        "",
        "`arm − warm start` in official success: what each arm's training did to the policy it started from, "
        "paired as above.",
        "",
        *markdown_table(diff_header, _diff_rows(results, boot, to_warm)),
        "",
    ]


def _cost_section(results: Results) -> list[str]:
    keys = ("act_tokens", "rehearse_tokens", "env_calls", "generated_tokens")
    rows = []
    for arm in results.experiment.arms:
        runs = [r for r in results.runs if r.arm == arm]
        if not runs:
            rows.append([arm, "0", *("—" for _ in range(2 + len(keys)))])
            continue
        means = [sum(r.seconds for r in runs) / len(runs), sum(r.steps for r in runs) / len(runs)]
        means += [sum(r.cost[k] for r in runs) / len(runs) for k in keys]
        rows.append([arm, str(len(runs)), *(f"{m:.1f}" for m in means)])
    header = ["arm", "runs", "wall s per run", "steps", *(k.replace("_", " ") for k in keys)]
    return ["## Cost of RL", "", "Mean over the arm's runs (one per seed).", "", *markdown_table(header, rows), ""]


def _rehearsal_section(results: Results, boot: Boot) -> list[str]:
    rows = []
    for label, arm in policies(results):
        if not evals_of(results, arm):
            continue
        for setting in results.experiment.settings:
            ended = limit_shares([it for e in evals_of(results, arm) for it in e.items if it.setting == setting])
            if setting == NONE:
                rows.append([label, setting, format_interval(boot.mean(success(results, arm))), "—", ended])
                continue
            values, base = rehearsal_success(results, arm, setting)
            gain = format_interval(boot.diff(values, base))
            rows.append([label, setting, format_interval(boot.mean(values)), gain, ended])
        best = best_gain(results, arm, boot) if sum(s != NONE for s in results.experiment.settings) > 1 else None
        if best:
            rows.append([label, f"best: {best[0]}", "", format_interval(best[1]), ""])
    return [
        "## Private rehearsal",
        "",
        "Official success pooled over splits for each rehearsal setting (`mode@N`: N private rehearsals per user "
        "turn before the committed attempt); gain = success with the setting − success with `none`, paired by task; "
        "ended by a limit: committed attempts / imagined attempts that a rollout limit ended (`max_steps`, "
        "`truncated`, ...), of those recorded (— in files without flags)." + _coverage(results),
        "",
        *markdown_table(["policy", "setting", "success (pooled)", "gain over none", "ended by a limit"], rows),
        "",
    ]


def _seeds(seeds: Iterable[int | None]) -> str:
    """``seed 0``, ``seeds 0, 1``, ``no seed``."""
    names = [str(s) for s in seeds]
    return f"seed{'s' * (len(names) > 1)} {', '.join(names)}" if names else "no seed"


def _coverage(results: Results) -> str:
    """The sentence on the seeds the rehearsal settings cover, when it is fewer than the evaluated runs'
    (``evaluation.rehearsal_seeds``); empty when it is every one."""
    rehearsed = [s for s in results.experiment.settings if s != NONE]
    covered = {arm: seeds_with(results, arm, rehearsed) for arm in results.experiment.arms}
    evaluated = {arm: [e.seed for e in evals_of(results, arm)] for arm in results.experiment.arms}
    if not rehearsed or covered == evaluated:
        return ""
    runs = sorted({s for seeds in evaluated.values() for s in seeds if s is not None})
    warm = ", and the warm start" if seeds_with(results, WARM, rehearsed) else ""
    if len({tuple(seeds) for seeds in covered.values()}) == 1:
        which = f"the runs of {_seeds(next(iter(covered.values())))}"
    else:
        which = "the runs of " + "; ".join(f"{arm}: {_seeds(seeds)}" for arm, seeds in covered.items())
    return (
        f" The rehearsal settings cover {which} of the evaluated {_seeds(runs)} "
        f"(`evaluation.rehearsal_seeds`){warm}: a setting's success and its gain are on the task × seed cells it "
        "has, its gain paired with `none` on the same cells; the `none` rows keep every seed."
    )


def _verdict_section(results: Results, boot: Boot) -> list[str]:
    lines = ["## Verdicts", ""]
    if not results.experiment.hypotheses:
        lines.append("No hypotheses declared (`hypotheses:` in the experiment config; docs/experiment.md).")
    for v in judge(results, boot):
        evidence = f" {v.evidence}." if v.evidence else ""
        lines.append(f"- **{v.name}** ({v.statement}): **{v.verdict}**.{evidence} *Rule:* {v.rule}.")
    return [*lines, ""]


def _figure_section(results: Results) -> list[str]:
    lines = ["## Figures", ""]
    for name, caption in figures_of(results).items():
        lines += [f"![{caption}](figures/{name})", "", f"*{caption}*", ""]
    return lines


def render_report(results: Results, n_boot: int = 2000, seed: int = 0, released: list[str] | None = None) -> str:
    """The markdown text of ``report.md``: a function of the results and the bootstrap settings only.

    Args:
        results: from :func:`load_results`.
        n_boot: bootstrap replicates per interval.
        seed: generator seed of every interval.
        released: the section naming the released policies (:func:`~envace.experiment.release.release_section`).
    """
    boot = Boot(n_boot, seed)
    sections = [
        _header(results),
        ["## Notes", "", results.notes, ""] if results.notes else [],
        _mdd_section(results),
        _results_section(results, boot),
        strata_section(results, boot),
        against_warm_start_section(results),
        training_section(results),
        _cost_section(results),
        _rehearsal_section(results, boot),
        _verdict_section(results, boot),
        _figure_section(results),
        released or [],
    ]
    return "\n".join(line for section in sections for line in section).rstrip("\n") + "\n"


def write_report(folder: str | Path, n_boot: int = 2000, seed: int = 0) -> Path:
    """Read an experiment folder's result files and write ``report.md`` and ``figures/*.png`` into it.

    Args:
        folder: the experiment folder (``experiment.json`` and ``units/``).
        n_boot: bootstrap replicates per interval.
        seed: generator seed of every interval.

    Returns:
        The path of ``report.md``.
    """
    folder = Path(folder)
    from envace.experiment.drift_report import is_drift_experiment, write_drift_report

    if is_drift_experiment(folder):  # evaluations under drift (of another grid's policies): its own report
        return write_drift_report(folder, n_boot, seed)
    from envace.experiment.release import release_section

    results = load_results(folder)
    text = render_report(results, n_boot, seed, release_section(folder))
    write_figures(results, folder / "figures", Boot(n_boot, seed))
    path = folder / REPORT_FILE
    path.write_text(text, encoding="utf-8")
    return path
