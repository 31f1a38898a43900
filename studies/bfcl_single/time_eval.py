"""Seconds per held-out item of the grid's evaluation, to size its eval units (README.md, "Compute").

Runs the experiment's own eval unit (:func:`envace.experiment.evaluate.evaluate_unit`, the code every
``eval-*`` unit of grid.yaml runs: its limits, sampling and tool style) on ``--items`` held-out items
spread over the declared test split, with ``--policy`` (default: the packaged SmolLM2-135M the warm start
begins from; or a checkpoint), and prints the wall and CPU seconds per item, the success and the CPU.

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python studies/bfcl_single/time_eval.py --items 20
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import time
from pathlib import Path
from typing import Any

import envace.evaluation
from envace.experiment.evaluate import evaluate_unit
from envace.experiment.grid import find_unit, load_config

GRID = Path(__file__).with_name("grid.yaml")


def cpu_model() -> str:
    """The ``model name`` line of /proc/cpuinfo (else the platform's processor string)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def timed(seconds: list[float], cpu_seconds: list[float]) -> Any:
    """``envace.evaluation.evaluate`` that also appends the seconds its settings ran (rollout and scoring,
    no policy loading) to ``seconds``, and this process's CPU seconds in the call (task loading included)
    to ``cpu_seconds``: the unit imports it when it runs."""
    evaluate = envace.evaluation.evaluate

    def run(*args: Any, **kwargs: Any) -> Any:
        cpu = time.process_time()
        result = evaluate(*args, **kwargs)
        seconds.append(sum(result.seconds.values()))
        cpu_seconds.append(time.process_time() - cpu)
        return result

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=20, help="held-out items, spread over the test split")
    p.add_argument("--policy", default="smollm2-135m", help="a checkpoint or a model name (load_eval_policy)")
    args = p.parse_args()
    cfg = load_config(str(GRID))
    cfg = dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, tasks_per_split=args.items))
    ran: list[float] = []
    cpu: list[float] = []
    envace.evaluation.evaluate = timed(ran, cpu)
    began = time.perf_counter()
    result = evaluate_unit(cfg, find_unit(cfg, "eval-warm_start"), Path(args.policy))
    wall, items, scored = time.perf_counter() - began, result["items"], sum(ran)
    wins, n = sum(it["success"] for it in items), len(items)
    print(
        f"{n} items: {scored:.1f} s rolling out and scoring, {scored / n:.2f} s per item ({sum(cpu) / n:.2f} "
        f"CPU-s per item); the unit's wall {wall:.1f} s (loading included); success {wins}/{n}; CPU {cpu_model()}; "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    for stratum in dict.fromkeys(it["split"] for it in items):
        mine = [it for it in items if it["split"] == stratum]
        print(f"  {stratum}: {len(mine)} items, {sum(it['success'] for it in mine)} passed")


if __name__ == "__main__":
    main()
