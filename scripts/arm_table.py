"""The validation figures of each arm's run, from its TensorBoard events (docs/training.md, "The arms").

Each arm's fit writes ``<runs>/<benchmark>/<arm>/`` (configs/arms/). This prints, per arm, the last
validation's ``val/committed/*`` and ``val/imagined/*`` figures and the run's environment calls:

    python scripts/arm_table.py --runs runs/bfcl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envace.experiment.runner import event_scalars

ROWS = [
    ("val/committed/official_success/bfcl", "committed: official success (multi_turn_checker)"),
    ("val/committed/proxy_score/bfcl", "committed: training proxy"),
    ("val/committed/act_tool_f1/bfcl", "committed: act tool F1"),
    ("val/imagined/fidelity/pairs", "imagined: call pairs of its own calls"),
    ("val/imagined/fidelity/value_f1", "imagined: value F1 on its own calls"),
    ("val/imagined/fidelity_gold/value_f1", "imagined: value F1 on the gold calls"),
    ("val/imagined/fidelity_gold/json_valid", "imagined: JSON-valid on the gold calls"),
    ("val/imagined/proxy_score/bfcl", "imagined: proxy (biased)"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="runs/bfcl", help="the benchmark's run folder (one sub-folder per arm)")
    args = parser.parse_args()
    arms = {d.name: event_scalars(d) for d in sorted(Path(args.runs).iterdir()) if d.is_dir()}
    arms = {a: s for a, s in arms.items() if any(t.startswith("val/") for t in s)}
    if not arms:
        raise SystemExit(f"no run with val/* scalars under {args.runs}")
    print("| figure (last validation) | " + " | ".join(arms) + " |")
    print("|---" * (len(arms) + 1) + "|")
    for tag, label in ROWS:
        cells = [_last(s.get(tag)) for s in arms.values()]
        print(f"| {label} | " + " | ".join(cells) + " |")
    env = [str(int(sum(v for _, v in s["cost/env_calls"]))) if "cost/env_calls" in s else "—" for s in arms.values()]
    print("| RL: calls a real environment answered | " + " | ".join(env) + " |")
    steps = [str(int(s["val/committed/official_success/bfcl"][-1][0]) + 1) if "val/committed/official_success/bfcl" in s
             else "—" for s in arms.values()]  # fmt: skip
    print("| step of the last validation | " + " | ".join(steps) + " |")


def _last(points: list[list[float]] | None) -> str:
    if not points:
        return "—"
    value = points[-1][1]
    return "—" if value != value else f"{value:.3f}"  # NaN: no pair to score


if __name__ == "__main__":
    main()
