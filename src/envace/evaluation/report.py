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
from typing import Any

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


def plot(rows: list[Row], metric: str, category: str, path: Path) -> bool:
    """Success vs number of rehearsals, parallel and sequential (n = 0 starts both lines).

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
    base = [r for r in picked if r.n == 0]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for mode, marker in (("parallel", "o"), ("sequential", "s")):
        pts = sorted([(r.n, r.value) for r in picked if r.mode == mode] + [(0, r.value) for r in base])
        if len(pts) > len(base):
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker=marker, label=mode)
    if not ax.lines:
        ax.plot([0], [100 * base[0].value], marker="o", label="plain") if base else None
    ax.set_xticks(sorted({r.n for r in picked}))
    ax.set_ylim(-2, 102)
    ax.set_xlabel("rehearsals per user turn (N)")
    ax.set_ylabel(f"{metric} (%)")
    ax.set_title(f"{picked[0].benchmark} {category}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(
    out: Path, rows: list[Row], items: list[ItemResult], notes: list[str], meta: dict[str, Any],
    headline: tuple[str, str],
) -> dict[str, str]:  # fmt: skip
    """Write ``table.csv``, ``table.md``, ``items.jsonl``, ``summary.json`` and the plot into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"csv": out / "table.csv", "markdown": out / "table.md", "items": out / "items.jsonl",
             "summary": out / "summary.json"}  # fmt: skip
    files["csv"].write_text(to_csv(rows), encoding="utf-8")
    files["markdown"].write_text(to_markdown(rows, notes), encoding="utf-8")
    with files["items"].open("w", encoding="utf-8") as fh:
        for it in items:
            fh.write(json.dumps(it.to_dict(), ensure_ascii=False, default=str) + "\n")
    if plot(rows, headline[0], headline[1], out / PLOT_FILE):
        files["plot"] = out / PLOT_FILE
    files["summary"].write_text(json.dumps({**meta, "notes": notes}, indent=2, default=str), encoding="utf-8")
    return {k: str(v) for k, v in files.items()}
