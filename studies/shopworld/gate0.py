"""Gate 0 of the ShopWorld study: warm starts by the difficulty rule of rules.yaml, each evaluated on tune.

    .venv/bin/python studies/shopworld/gate0.py            # resumable: a landed N is read, not rerun

For each N the rule visits: a warm-start fit on the first N sft gold episodes (N / 4 steps of 4, no
RL, no in-fit validation; checkpoints under ~/.cache/envace/studies/shopworld/ws-N, resumed from
their last.ckpt), then ``envace evaluate`` on the 200 tune tasks, greedy. Each N's figures land in
results/gate0/ws-N.json (commit it as it lands); the choice, by the rule, in results/gate0/choice.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results" / "gate0"
CACHE = Path(os.environ.get("ENVACE_STUDY_CACHE", Path.home() / ".cache" / "envace" / "studies" / "shopworld"))
ENVACE = [sys.executable, "-m", "envace.cli"]
LEARNABLE = ("S1_copy", "S2_cheaper", "S3_fallback", "S4_carry")


def warm_start(n: int) -> tuple[Path, float]:
    """The warm start on the first ``n`` sft episodes: its checkpoint and the fit's seconds (resumed if cut)."""
    work = CACHE / f"ws-{n}"
    done = work / "done.ckpt"
    if done.exists():
        return done, float(json.loads((work / "fit.json").read_text())["seconds"])
    steps = n // 4
    args = [*ENVACE, "fit", "--config", "configs/shopworld.yaml", "--data.limit", str(n),
            "--model.init_args.warm_start_steps", str(steps), "--trainer.max_steps", str(steps),
            "--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0",
            "--trainer.logger.init_args.save_dir", str(work), "--trainer.logger.init_args.version", "fit"]  # fmt: skip
    last = work / "shopworld" / "fit" / "checkpoints" / "last.ckpt"
    if last.exists():
        args += ["--ckpt_path", str(last)]
    start = time.perf_counter()
    subprocess.run(args, cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
    last.replace(done)
    (work / "fit.json").write_text(json.dumps({"seconds": seconds, "steps": steps}))
    return done, seconds


def tune_success(n: int, checkpoint: Path) -> dict:
    out = CACHE / f"ws-{n}" / "tune"
    start = time.perf_counter()
    subprocess.run([*ENVACE, "evaluate", "--config", "configs/eval/shopworld.yaml", "--policy", str(checkpoint),
                    "--tasks.split", "tune", "--out", str(out)], cwd=ROOT, check=True)  # fmt: skip
    seconds = time.perf_counter() - start
    items = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    by = {c: [it["success"] for it in items if it["category"] == c] for c in sorted({it["category"] for it in items})}
    return {"success": {c: sum(v) / len(v) for c, v in by.items()},
            "overall": sum(it["success"] for it in items) / len(items), "items": len(items),
            "eval_seconds": round(seconds, 1)}  # fmt: skip


def in_band(r: dict, band: dict) -> bool:
    lo, hi = band["overall"]
    slo, shi = band["each_of_S1_S4"]
    return lo <= r["overall"] <= hi and all(slo <= r["success"][s] <= shi for s in LEARNABLE)


def main() -> None:
    rule = yaml.safe_load((HERE / "rules.yaml").read_text())["difficulty"]
    values, n, seen = rule["values"], rule["start"], {}
    RESULTS.mkdir(parents=True, exist_ok=True)
    while True:
        path = RESULTS / f"ws-{n}.json"
        if not path.exists():
            ckpt, fit_seconds = warm_start(n)
            record = {"N": n, "steps": n // 4, "fit_seconds": round(fit_seconds, 1), **tune_success(n, ckpt),
                      "cpu": _cpu(), "checkpoint": str(ckpt)}  # fmt: skip
            path.write_text(json.dumps(record, indent=1) + "\n")
            print(f"[gate0] ws-{n}: tune {record['overall']:.3f} {record['success']}", flush=True)
        seen[n] = json.loads(path.read_text())
        if in_band(seen[n], rule["band"]):
            return _choose(n, "in the band", seen)
        i = values.index(n) + (-1 if seen[n]["overall"] > 0.45 else 1)
        if not 0 <= i < len(values) or values[i] in seen:  # left the list or turned back
            best = min(seen, key=lambda k: (abs(seen[k]["overall"] - 0.45), k))
            return _choose(best, "no N in the band: the nearest 0.45", seen)
        n = values[i]


def _choose(n: int, why: str, seen: dict) -> None:
    (RESULTS / "choice.json").write_text(json.dumps({"N": n, "why": why, "visited": sorted(seen)}, indent=1) + "\n")
    print(f"[gate0] chosen N = {n} ({why})", flush=True)


def _cpu() -> str:
    from envace.hardware import capability

    cap = capability()
    return f"{cap.reason}"


if __name__ == "__main__":
    main()
