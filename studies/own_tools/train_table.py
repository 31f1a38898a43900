"""The own-tools doc's training table (docs/own-tools.md §5) from the fits' event files, and paired
per-task differences from ``envace evaluate`` outputs.

A row is a fit's validation at one logged step, read from its TensorBoard events
(:func:`envace.metrics.events.read_scalars`): held-out success and score (``val/committed/*``, the
policy acting against the real server, scored by the source's reward) and rehearsal fidelity on the
policy's own calls (``val/imagined/fidelity/*``) and on the gold calls (``val/imagined/fidelity_gold/*``).
The fit logs means only, so per-task outcomes come from ``envace evaluate --benchmark tasks`` on the
same checkpoints (its ``items.jsonl``); ``--diff A,B`` prints the paired difference A − B over the
tasks both hold, with a percentile bootstrap over tasks (:func:`envace.experiment.stats.paired_difference`),
and the minimum detectable difference for that many tasks and one seed::

    R=~/.cache/envace/shop_mcp/runs45/mcp_example
    python studies/own_tools/train_table.py --row "warm start=$R/envace-s0@0" --row "envace=$R/envace-s0@11" \\
        --items warm=$R/eval/warm/items.jsonl --items envace=$R/eval/envace-s0/items.jsonl --diff envace,warm
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from envace.experiment.stats import minimum_detectable_difference, paired_difference
from envace.metrics.events import read_scalars

SUCCESS, SCORE = "val/committed/proxy_success/tasks", "val/committed/proxy_score/tasks"
FIDELITY = ("exact_match", "key_f1", "value_f1")


def _fidelity(scalars: dict[str, dict[int, float]], kind: str, step: int) -> str:
    """``exact / key F1 / value F1 (pairs)`` of ``val/imagined/<kind>/*`` at ``step``; ``—`` without pairs."""
    pairs = int(scalars.get(f"val/imagined/{kind}/pairs", {}).get(step, 0))
    if not pairs:
        return "— (0)"
    return " / ".join(f"{scalars[f'val/imagined/{kind}/{m}'][step]:.3f}" for m in FIDELITY) + f" ({pairs})"


def table_row(label: str, run: str, step: int) -> str:
    """One markdown row: success, score, fidelity on own calls, fidelity on gold calls at ``step``."""
    scalars = {tag: dict(points) for tag, points in read_scalars(Path(run).expanduser()).items()}
    if step not in scalars.get(SUCCESS, {}):
        raise SystemExit(f"{run}: no {SUCCESS} at step {step} (logged: {sorted(scalars.get(SUCCESS, {}))})")
    cells = [f"{scalars[SUCCESS][step]:.3f}", f"{scalars[SCORE][step]:.3f}"]
    cells += [_fidelity(scalars, "fidelity", step), _fidelity(scalars, "fidelity_gold", step)]
    return f"| {label} | " + " | ".join(cells) + " |"


def per_task(path: str) -> dict[str, list[float]]:
    """``{task_id: [success of each trial]}`` of one ``envace evaluate`` output's ``items.jsonl``."""
    out: dict[str, list[float]] = {}
    for line in Path(path).expanduser().read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        out.setdefault(item["task_id"], []).append(float(item["success"]))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _labelled(spec: str) -> tuple[str, str]:
    label, sep, value = spec.partition("=")
    if not sep or not label or not value:
        raise SystemExit(f"expected LABEL=VALUE, got {spec!r}")
    return label, value


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--row", action="append", default=[], help="LABEL=RUN_DIR@STEP (a fit's validation)")
    ap.add_argument("--items", action="append", default=[], help="LABEL=items.jsonl (envace evaluate)")
    ap.add_argument("--diff", action="append", default=[], help="A,B: paired success difference A − B")
    ap.add_argument("--n_boot", type=int, default=10000)
    args = ap.parse_args(argv)
    if args.row:
        print(
            "| policy | held-out success | gold-calls score | fidelity, own calls: exact / key F1 / value F1 "
            "(pairs) | fidelity, gold calls: exact / key F1 / value F1 (pairs) |"
        )
        print("|---|---|---|---|---|")
        for label, spec in map(_labelled, args.row):
            run, _, step = spec.rpartition("@")
            print(table_row(label, run, int(step)))
    items = {label: per_task(path) for label, path in map(_labelled, args.items)}
    for label, tasks in items.items():
        mean = sum(map(_mean, tasks.values())) / len(tasks)
        print(f"{label}: success {mean:.3f} over {len(tasks)} tasks (envace evaluate)")
    for pair in args.diff:
        a, _, b = pair.partition(",")
        d, lo, hi, n = paired_difference(items[a], items[b], n_boot=args.n_boot)
        both = [*items[a].values(), *items[b].values()]
        p = sum(map(_mean, both)) / len(both)
        mdd = minimum_detectable_difference(p, n, 1)
        wins = sum(_mean(items[a][t]) > _mean(items[b][t]) for t in set(items[a]) & set(items[b]))
        losses = sum(_mean(items[a][t]) < _mean(items[b][t]) for t in set(items[a]) & set(items[b]))
        print(
            f"{a} − {b}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}] paired bootstrap over {n} tasks "
            f"({a} alone solves {wins}, {b} alone {losses}); MDD at p={p:.2f}, n={n}, one seed: {mdd:.3f}"
        )


if __name__ == "__main__":
    main()
