"""The figures of the experiment report (PNG, matplotlib's Agg backend, imported on first use).

Each figure is drawn from the result files with the report's bootstrap settings; one of the four of
:data:`FIGURES` without data still gets written (with a "no data" note), so ``report.md`` can always
link all four. The training figure (:data:`TRAINING_FIGURE`) is written, and linked, only when a run
file holds the ``train/*`` curves (:func:`figures_of`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from envace.experiment.hypotheses import Boot, Interval, arms_layout, gold_fidelity, rehearsal_success
from envace.experiment.results import Results, item_values
from envace.experiment.training_table import KL, MOVING_AVERAGE, REWARD, has_training_curves, moving_average

#: the curves figure's tags: the validation headline, turn score and gold-call fidelity over all tools
#: (a fit also logs each per benchmark ``/all`` and per tool ``/tool/<name>``: too many panels to read)
CURVE_TAGS = (
    "val/committed/official_success/bfcl",
    "val/committed/turn_score/bfcl",
    "val/imagined/fidelity_gold/value_f1",
)
FIGURES = {
    "success.png": "Official success per policy (setting none), mean over tasks with 95% cluster bootstrap interval",
    "curves.png": "Validation curves during RL: mean over seeds per arm vs step",
    "rehearsal.png": "Official success (pooled) vs number of private rehearsals N, parallel and sequential",
    "fidelity.png": "Gold-call rehearsal fidelity (value_f1, pooled, {layout}): warm start vs each arm's final policy",
}
TRAINING_FIGURE = {
    "training.png": f"Training per RL step, mean over each arm's runs: reward (moving average over {MOVING_AVERAGE} "
    "steps; thin: per step) and KL to the warm start",
}
_SETTING = re.compile(r"^(?P<mode>[a-z_]+)@(?P<n>\d+)$")


def _labels(results: Results) -> list[tuple[str, str]]:
    return [("warm start", "warm_start")] + [(a, a) for a in results.experiment.arms]


def _no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)


def _errorbar(ax: Any, x: float, ci: Interval | None, **kw: Any) -> None:
    if ci is not None:
        ax.errorbar([x], [ci[0]], yerr=[[ci[0] - ci[1]], [ci[2] - ci[0]]], fmt="o", capsize=3, **kw)


def _success(results: Results, boot: Boot, ax: Any) -> None:
    labels = _labels(results)
    splits = results.experiment.splits
    width = 0.6 / max(len(splits), 1)
    for j, split in enumerate(splits):
        for i, (_, arm) in enumerate(labels):
            ci = boot.mean(item_values(results, arm, "success", [split]))
            _errorbar(ax, i + (j - (len(splits) - 1) / 2) * width, ci, color=f"C{j}", label=split if i == 0 else None)
    ax.set_xticks(range(len(labels)), [label for label, _ in labels], rotation=20)
    ax.set_ylabel("official success")
    ax.set_title("official success, no rehearsal")
    ax.set_ylim(-0.02, 1.02)
    if ax.containers:
        ax.legend()
    else:
        _no_data(ax)


def curve_tags(results: Results) -> list[str]:
    """The curve tags of the run files that the curves figure shows, sorted."""
    return sorted({t for r in results.runs for t in r.curves if t in CURVE_TAGS})


def mean_curve(results: Results, arm: str, tag: str) -> list[tuple[int, float]]:
    """Mean over the arm's runs of one curve at each step (a step's mean is over the runs that logged it)."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for run in results.runs:
        if run.arm == arm:
            for step, value in run.curves.get(tag, []):
                by_step[step].append(value)
    return [(step, sum(vs) / len(vs)) for step, vs in sorted(by_step.items())]


def _curves(results: Results, fig: Any) -> None:
    tags = curve_tags(results)
    if not tags:
        _no_data(fig.add_subplot(1, 1, 1))
        return
    cols = min(3, len(tags))
    rows = -(-len(tags) // cols)
    for k, tag in enumerate(tags):
        ax = fig.add_subplot(rows, cols, k + 1)
        for i, arm in enumerate(results.experiment.arms):
            points = mean_curve(results, arm, tag)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", color=f"C{i}", label=arm)
        ax.set_title(tag, fontsize=8)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)


def _rehearsal(results: Results, boot: Boot, axes: Any) -> None:
    settings = {s: m for s in results.experiment.settings if (m := _SETTING.match(s))}
    for ax, mode in zip(axes, ("parallel", "sequential"), strict=True):
        for i, (label, arm) in enumerate(_labels(results)):
            points, base = [], None
            for setting, m in settings.items():
                values, plain = rehearsal_success(results, arm, setting) if m["mode"] == mode else ({}, {})
                ci = boot.mean(values)
                points += [(int(m["n"]), ci[0])] if ci else []
                base = base or boot.mean(plain)  # N = 0 on the task × seed cells the settings have
            if points and base:  # the N = 0 point alone is no curve
                points = sorted([(0, base[0]), *points])
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=f"C{i}", label=label)
        ax.set_title(mode)
        ax.set_xlabel("private rehearsals per user turn (N)")
        ax.set_ylabel("official success (pooled)")
        if ax.lines:
            ax.set_xticks(sorted({0, *(int(m["n"]) for m in settings.values() if m["mode"] == mode)}))
            ax.legend(fontsize=7)
        else:
            _no_data(ax)


def _fidelity(results: Results, boot: Boot, ax: Any) -> None:
    labels = _labels(results)
    layout, _ = arms_layout(results, [arm for _, arm in labels])
    for i, (_, arm) in enumerate(labels):
        ci = boot.mean(gold_fidelity(results, arm, "value_f1", layout))
        _errorbar(ax, i, ci, color=f"C{min(i, 1)}")
        if i == 0 and ci is not None:
            ax.axhline(ci[0], color="C0", linestyle="--", linewidth=0.8)
    ax.set_title(f"gold-call fidelity, {layout or 'no common'} gold layout (dashed: warm start)")
    ax.set_xticks(range(len(labels)), [label for label, _ in labels], rotation=20)
    ax.set_ylabel("gold-call value_f1")
    ax.set_ylim(-0.02, 1.02)
    if not ax.containers:
        _no_data(ax)


def _training(results: Results, axes: Any) -> None:
    reward_ax, kl_ax = axes
    for i, arm in enumerate(results.experiment.arms):
        reward = mean_curve(results, arm, REWARD)
        if reward:
            steps, values = [p[0] for p in reward], [p[1] for p in reward]
            reward_ax.plot(steps, values, color=f"C{i}", linewidth=0.6, alpha=0.35)
            reward_ax.plot(steps, moving_average(values), color=f"C{i}", label=arm)
        kl = mean_curve(results, arm, KL)
        if kl:
            kl_ax.plot([p[0] for p in kl], [p[1] for p in kl], color=f"C{i}", label=arm)
    for ax, title in ((reward_ax, f"training reward ({REWARD})"), (kl_ax, f"KL to the warm start ({KL})")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL step")
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            _no_data(ax)


def figures_of(results: Results) -> dict[str, str]:
    """The figures written for these results, file name -> caption: :data:`FIGURES` (the fidelity's naming
    its gold layout, or that none is common), and the training figure when a run file holds its curves."""
    layout, _ = arms_layout(results, [arm for _, arm in _labels(results)])
    fidelity = FIGURES["fidelity.png"].format(layout=f"{layout} gold layout" if layout else "no gold layout in common")
    return {**FIGURES, "fidelity.png": fidelity, **(TRAINING_FIGURE if has_training_curves(results) else {})}


def write_figures(results: Results, folder: Path, boot: Boot) -> list[Path]:
    """Write the figures of :func:`figures_of` into ``folder``.

    Args:
        results: the loaded results.
        folder: where the PNGs go (created).
        boot: the bootstrap settings of the intervals drawn.

    Returns:
        The paths written, in the order of :func:`figures_of`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    figs = {
        "success.png": plt.figure(figsize=(7, 4)),
        "curves.png": plt.figure(figsize=(12, 3.5 * -(-max(len(curve_tags(results)), 1) // 3))),
        "rehearsal.png": plt.figure(figsize=(10, 4)),
        "fidelity.png": plt.figure(figsize=(7, 4)),
    }
    _success(results, boot, figs["success.png"].add_subplot(1, 1, 1))
    _curves(results, figs["curves.png"])
    _rehearsal(results, boot, figs["rehearsal.png"].subplots(1, 2))
    _fidelity(results, boot, figs["fidelity.png"].add_subplot(1, 1, 1))
    if has_training_curves(results):
        figs["training.png"] = plt.figure(figsize=(12, 4))
        _training(results, figs["training.png"].subplots(1, 2))
    paths = []
    for name in figures_of(results):
        fig = figs[name]
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        paths.append(folder / name)
    return paths
