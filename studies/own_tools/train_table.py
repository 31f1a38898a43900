"""The own-tools doc's training table (docs/own-tools.md §5) from the fits' event files, and paired
per-task differences from ``envace evaluate`` outputs.

A row is a fit's validation at one logged step, read from its TensorBoard events
(:func:`envace.metrics.events.read_scalars`): held-out success and score (``val/committed/*``, the
policy acting against the real server, scored by the source's reward) and rehearsal fidelity on the
policy's own calls (``val/imagined/fidelity/*``) and on the gold calls (``val/imagined/fidelity_gold/*``).
The fit logs means only: ``--means A,B`` gives row A's success − row B's with an unpaired (Newcombe)
interval and the minimum detectable difference for ``--n_tasks`` tasks and one seed. Per-task outcomes
come from ``envace evaluate --benchmark tasks`` on the same checkpoints (its ``items.jsonl``):
``--diff A,B`` prints the paired difference A − B over the tasks both hold, with a percentile bootstrap
over tasks (:func:`envace.experiment.stats.paired_difference`)::

    R=~/.cache/envace/shop_mcp/runs45/mcp_example
    python studies/own_tools/train_table.py --row "warm start=$R/envace-s0@0" --row "envace=$R/envace-s0@11" \\
        --means "envace,warm start"
    python studies/own_tools/train_table.py --items warm=<out>/items.jsonl --items envace=<out>/items.jsonl \\
        --diff envace,warm
"""

from __future__ import annotations

import argparse
import json
import math
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


def success(run: str, step: int) -> float:
    """``val/committed/proxy_success/tasks`` of a fit at ``step``."""
    return dict(read_scalars(Path(run).expanduser())[SUCCESS])[step]


def wilson(p: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95 % interval of a proportion ``p`` of ``n`` (Newcombe 1998, method 3).

    >>> [round(x, 4) for x in wilson(0.5, 10)]
    [0.2366, 0.7634]
    """
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def newcombe(p1: float, p2: float, n: int) -> tuple[float, float]:
    """95 % interval of ``p1 − p2`` for two independent proportions of ``n`` each (Newcombe 1998,
    method 10, from Wilson intervals). For two policies scored on the same tasks it ignores the pairing:
    with outcomes positively correlated across tasks (the usual case) it is wider than a paired one.

    >>> [round(x, 4) for x in newcombe(0.5, 0.5, 10)]
    [-0.3725, 0.3725]
    """
    (l1, u1), (l2, u2) = wilson(p1, n), wilson(p2, n)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


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
    ap.add_argument("--means", action="append", default=[], help="A,B: row A's success − row B's, unpaired")
    ap.add_argument("--n_tasks", type=int, default=45, help="validation tasks behind each row's success")
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
    rows = {label: spec.rpartition("@") for label, spec in map(_labelled, args.row)}
    for pair in args.means:
        a, _, b = pair.partition(",")
        pa, pb = (success(rows[x][0], int(rows[x][2])) for x in (a, b))
        lo, hi = newcombe(pa, pb, args.n_tasks)
        mdd = minimum_detectable_difference((pa + pb) / 2, args.n_tasks, 1)
        print(
            f"{a} − {b}: {pa - pb:+.3f} [{lo:+.3f}, {hi:+.3f}] Newcombe, unpaired, n={args.n_tasks} each; "
            f"MDD at p={(pa + pb) / 2:.2f}, one seed: {mdd:.3f}"
        )
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
