"""Outputs of an evaluation run: the table (CSV and markdown), per-item JSONL, a plot, a summary.

One table row per benchmark × category × imagination setting × metric::

    benchmark, category, mode, n, metric, value, n_items, imagined_tokens, committed_tokens, memory_tokens

``value`` is a fraction in [0, 1]; ``n_items`` counts distinct tasks; token columns are totals over
the row's committed episodes (all trials): tokens the policy generated in imagined attempts, in the
committed episodes, and the imagination memory notes added to the committed context. Wall times are
kept out of the table (so that two runs with one seed give identical tables) and go to
``summary.json``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from envace.evaluation.base import ItemResult, Summary

COLUMNS = ("benchmark", "category", "mode", "n", "metric", "value", "n_items", "imagined_tokens",
           "committed_tokens", "memory_tokens")  # fmt: skip
PLOT_FILE = "success_vs_imagined_attempts.png"


@dataclass
class Row:
    """One line of the results table (see the module docstring)."""

    benchmark: str
    category: str
    mode: str
    n: int
    metric: str
    value: float
    n_items: int
    imagined_tokens: int
    committed_tokens: int
    memory_tokens: int


def make_rows(benchmark: str, mode: str, n: int, summaries: list[Summary]) -> list[Row]:
    """Table rows of one imagination setting from its summaries."""
    rows = []
    for s in summaries:
        rows.append(
            Row(
                benchmark=benchmark,
                category=s.category,
                mode=mode,
                n=n,
                metric=s.metric,
                value=round(float(s.value), 6),
                n_items=len({it.task_id for it in s.items}),
                imagined_tokens=sum(it.tokens.imagined for it in s.items),
                committed_tokens=sum(it.tokens.committed for it in s.items),
                memory_tokens=sum(it.tokens.memory for it in s.items),
            )
        )
    return rows


def sort_rows(rows: list[Row]) -> list[Row]:
    """Rows by category (first-seen order), metric, then n and mode: settings side by side."""
    order: dict[tuple[str, str], int] = {}
    for r in rows:
        order.setdefault((r.category, r.metric), len(order))
    modes = {"none": 0, "parallel": 1, "sequential": 2}
    return sorted(rows, key=lambda r: (order[(r.category, r.metric)], r.n, modes.get(r.mode, 3)))


def to_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(asdict(r))
    return buf.getvalue()


def to_markdown(rows: list[Row], notes: list[str] | None = None) -> str:
    """The table as markdown (values in percent), with the notes as a list under it."""
    names = ["benchmark", "category", "mode", "n", "metric", "value (%)", "items", "imagined tokens",
             "committed tokens", "memory tokens"]  # fmt: skip
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for r in rows:
        lines.append(
            f"| {r.benchmark} | {r.category} | {r.mode} | {r.n} | {r.metric} | {100 * r.value:.1f} | {r.n_items} "
            f"| {r.imagined_tokens} | {r.committed_tokens} | {r.memory_tokens} |"
        )
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


#: the plotted series: mode, marker, line style, x offset (a fraction of the x range)
SERIES = (("parallel", "o", "-", -0.02), ("sequential", "s", "--", 0.02))
Interval = tuple[float, float]


class Series(NamedTuple):
    """One plotted line: its points (x offset from N, values and interval half-widths in percent)."""

    label: str
    marker: str
    style: str
    rows: list[Row]
    xs: list[float]
    ys: list[float]
    err: tuple[list[float], list[float]]  # below, above


def plot_series(rows: list[Row], intervals: dict[tuple[str, int], Interval] | None = None) -> list[Series]:
    """The lines of :func:`plot` for ``rows`` of one metric and category: parallel and sequential
    (each from the N = 0 row), each a little to its side of N; the plain row alone when nothing else ran."""
    intervals = intervals or {}
    base = [r for r in rows if r.n == 0]
    span = max([1] + [r.n for r in rows])
    kinds = [k for k in SERIES if any(r.mode == k[0] and r.n > 0 for r in rows)] or [("none", "o", "-", 0.0)]
    out = []
    for mode, marker, style, dx in kinds:
        pts = sorted([r for r in rows if r.mode == mode and r.n > 0] + base, key=lambda r: r.n)
        bars = [intervals.get((r.mode, r.n), (r.value, r.value)) for r in pts]
        err = ([100 * max(0.0, r.value - lo) for r, (lo, _) in zip(pts, bars, strict=True)],
               [100 * max(0.0, hi - r.value) for r, (_, hi) in zip(pts, bars, strict=True)])  # fmt: skip
        xs = [r.n + dx * span for r in pts]
        out.append(
            Series("plain" if mode == "none" else mode, marker, style, pts, xs, [100 * r.value for r in pts], err)
        )
    return out


def plot(rows: list[Row], metric: str, category: str, path: Path,
         intervals: dict[tuple[str, int], Interval] | None = None) -> bool:  # fmt: skip
    """Success vs number of rehearsals, parallel and sequential (n = 0 starts both lines).

    Every N carries its item count (``n=``) and every point, from ``intervals`` (``(mode, n) -> (lo, hi)``,
    fractions), its 95 % interval; the two series are drawn with their own marker and line style,
    a little apart on the x axis, so that equal values stay visible as two lines (:func:`plot_series`).
    Returns ``False`` (and writes nothing) when matplotlib is missing or there is nothing to plot.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    picked = [r for r in rows if r.metric == metric and r.category == category]
    if not picked:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    tops: dict[int, tuple[float, set[int]]] = {}
    for line in plot_series(picked, intervals):
        ax.errorbar(line.xs, line.ys, yerr=list(line.err), marker=line.marker, linestyle=line.style, capsize=3,
                    label=line.label, alpha=0.85)  # fmt: skip
        for r, y, up in zip(line.rows, line.ys, line.err[1], strict=True):
            top, sizes = tops.get(r.n, (0.0, set()))
            tops[r.n] = (max(top, y + up), sizes | {r.n_items})
    for n, (top, sizes) in tops.items():  # one label per N: the settings of one run share their tasks
        ax.annotate("n=" + "/".join(map(str, sorted(sizes))), (n, top), textcoords="offset points", xytext=(0, 8),
                    ha="center", fontsize=7)  # fmt: skip
    span = max([1] + [r.n for r in picked])
    ax.set_xticks(sorted(tops))
    ax.set_xlim(-0.15 * span, 1.15 * span)
    ax.set_ylim(-5, 105)
    ax.set_xlabel("rehearsals per user turn (N)")
    ax.set_ylabel(f"{metric} (%)")
    shown = "95% bootstrap intervals over tasks" if intervals else "no intervals"
    ax.set_title(f"{picked[0].benchmark} {category}; n = items per point; {shown}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(
    out: Path, rows: list[Row], items: list[ItemResult], notes: list[str], meta: dict[str, Any],
    headline: tuple[str, str], intervals: dict[tuple[str, int], Interval] | None = None,
) -> dict[str, str]:  # fmt: skip
    """Write ``table.csv``, ``table.md``, ``items.jsonl``, ``summary.json`` and the plot into ``out``
    (``intervals``: the headline's, per setting, on the plot)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"csv": out / "table.csv", "markdown": out / "table.md", "items": out / "items.jsonl",
             "summary": out / "summary.json"}  # fmt: skip
    files["csv"].write_text(to_csv(rows), encoding="utf-8")
    files["markdown"].write_text(to_markdown(rows, notes), encoding="utf-8")
    with files["items"].open("w", encoding="utf-8") as fh:
        for it in items:
            fh.write(json.dumps(it.to_dict(), ensure_ascii=False, default=str) + "\n")
    if plot(rows, headline[0], headline[1], out / PLOT_FILE, intervals):
        files["plot"] = out / PLOT_FILE
    files["summary"].write_text(json.dumps({**meta, "notes": notes}, indent=2, default=str), encoding="utf-8")
    return {k: str(v) for k, v in files.items()}
