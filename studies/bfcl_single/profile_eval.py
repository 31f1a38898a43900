"""Where the grid's evaluation spends its time (README.md, "Where an evaluation's time goes").

Runs the grid's eval unit (:func:`envace.experiment.evaluate.evaluate_unit`, as time_eval.py does) on
``--items`` held-out items of ``--categories`` (default: the grid's six), with ``--dtype`` over the
sampling dtype (default: the config's ``auto``), and times the engine's prefills and decoding steps and
the benchmark's scoring. Prints, per run: the prompt and generated tokens per item, how many rows ran
to the ``max_new_tokens`` cap, the rows per decoding step, and the seconds of prefill, decode, scoring
and the rest (task loading and rendering, the rollout's own work).

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python studies/bfcl_single/profile_eval.py --items 16 \
        --categories live_multiple
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace.evaluation.bfcl_single import BFCLSingleBenchmark
from envace.experiment.evaluate import evaluate_unit
from envace.experiment.grid import find_unit, load_config
from envace.rollout.engine.engine import GenerationEngine

GRID = Path(__file__).with_name("grid.yaml")


def timing(owner: Any, name: str, seconds: dict[str, float], count: Callable[[tuple[Any, ...]], None]) -> None:
    """Wrap ``owner.name`` so that its seconds add to ``seconds[name]`` and ``count(args)`` runs per call."""
    method = getattr(owner, name)

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        count(args)
        began = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - began

    setattr(owner, name, run)


def row_end(row: Any) -> tuple[int, bool]:
    """A leaving row's generated tokens, and whether it produced a stop token."""
    return len(row.sample.ids), row.sample.stopped


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=16, help="held-out items, spread over the categories")
    p.add_argument("--categories", nargs="*", default=None, help="default: the grid's")
    p.add_argument("--dtype", default=None, help="sampling.dtype: auto, float32 or bfloat16 (default: the config's)")
    p.add_argument("--policy", default="smollm2-135m")
    args = p.parse_args()
    cfg = load_config(str(GRID))
    spec = dataclasses.replace(cfg.evaluation, tasks_per_split=args.items)
    if args.categories:
        spec = dataclasses.replace(spec, categories=list(args.categories))
    if args.dtype:
        spec = dataclasses.replace(spec, sampling={**spec.sampling, "dtype": args.dtype})
    cfg = dataclasses.replace(cfg, evaluation=spec)
    seconds: dict[str, float] = dict.fromkeys(("_prefill", "_step", "_leave", "score"), 0.0)
    rows: list[int] = []
    engines: list[GenerationEngine] = []
    ended: list[tuple[int, bool]] = []  # per generation: its tokens, and whether it stopped (else the cap)

    def prefill(a: tuple[Any, ...]) -> None:  # (engine, model, requests, device): rows as negative counts
        engines.append(a[0])
        rows.append(-len(a[2]))

    def step(a: tuple[Any, ...]) -> None:  # (engine, model, run)
        rows.append(len(a[2].live))

    def leave(a: tuple[Any, ...]) -> None:  # (engine, run, slot)
        ended.append(row_end(a[1].rows[a[2]]))

    timing(GenerationEngine, "_prefill", seconds, prefill)
    timing(GenerationEngine, "_step", seconds, step)
    timing(GenerationEngine, "_leave", seconds, leave)
    timing(BFCLSingleBenchmark, "score", seconds, lambda a: None)
    began = time.perf_counter()
    cpu = time.process_time()
    result = evaluate_unit(cfg, find_unit(cfg, "eval-warm_start"), Path(args.policy))
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    items = result["items"]
    n = len(items)
    stats = list({id(e): e.stats for e in engines}.values())
    prompt, generated = sum(s.prompt_tokens for s in stats), sum(s.tokens for s in stats)
    prefills, steps = [-r for r in rows if r < 0], [r for r in rows if r > 0]
    limit = spec.limits.get("max_new_tokens")
    capped = sum(1 for _, stopped in ended if not stopped)
    lengths = sorted(length for length, _ in ended)
    spent = seconds["_prefill"] + seconds["_step"] + seconds["score"]
    print(
        f"{n} items ({dict(Counter(it['split'] for it in items))}), "
        f"sampling.dtype {spec.sampling.get('dtype', 'config')}, "
        f"max_new_tokens {limit}: wall {wall:.1f} s, CPU {cpu:.1f} s (policy loading included)\n"
        f"  prompt tokens per item {prompt / n:.0f}; generated tokens per item {generated / n:.0f}; "
        f"generations {len(ended)}, {capped} ran to the cap (lengths {lengths})\n"
        f"  prefills {len(prefills)} (rows {prefills}), decode steps {len(steps)} "
        f"(rows per step: mean {sum(steps) / max(1, len(steps)):.1f}, max {max(steps, default=0)})\n"
        f"  prefill {seconds['_prefill']:.1f} s, decode {seconds['_step']:.1f} s "
        f"({1000 * seconds['_step'] / max(1, len(steps)):.0f} ms per step), scoring {seconds['score']:.2f} s, "
        f"the rest {wall - spent:.1f} s; success {sum(it['success'] for it in items)}/{n}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
