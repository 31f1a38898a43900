"""Where one decoding step of the rollout goes: milliseconds per step and the share of its parts.

::

    .venv/bin/python studies/performance/decode_step.py  # OpenMP's default wait policy
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python studies/performance/decode_step.py  # as on a shared machine
    .venv/bin/python studies/performance/decode_step.py --dtype bfloat16  # the bf16 sampling copy

The packaged SmolLM2-135M samples through the engine's copy (prepacked linear layers, as
``envace fit`` samples on CPU). For each batch width, ``--cached`` tokens are prefilled into the
engine's in-place KV cache, then ``--steps`` single-token steps are timed (the attention mask grows
by one column per step, as in the engine), and the same steps again under ``torch.profiler`` for the
time of the linear layers' and attention's kernels; ``other_ms`` is the rest of the untraced step
(element-wise ops, norms, rotary, cache writes, and the Python between them). Prints one JSON
object; ``docs/performance.md`` quotes it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import Any

import jsonargparse
import torch
from transformers import DynamicCache

from envace.bench.common import make_module
from envace.rollout.engine import GenerationEngine, GrowingLayer

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
PARTS = {"linear": ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"), "attention": ("flash_attention",)}


def step_split(model: Any, rows: int, cached: int, steps: int) -> dict[str, Any]:
    """Milliseconds per decoding step at ``rows`` rows after ``cached`` tokens, and its parts."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer(cached + 3 * steps + 8) for _ in cache.layers]
    mask = torch.ones(rows, cached, dtype=torch.long)
    with torch.no_grad():
        model(input_ids=torch.randint(100, 1000, (rows, cached)), attention_mask=mask, cache=cache, use_cache=True,
              logits_to_keep=1)  # fmt: skip
        token = torch.randint(100, 1000, (rows, 1))

        def step() -> None:
            nonlocal mask
            mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
            position = torch.full((rows, 1), mask.shape[1] - 1)
            model(input_ids=token, attention_mask=mask, position_ids=position, cache=cache, use_cache=True,
                  logits_to_keep=1)  # fmt: skip

        step()  # warm-up
        began = time.perf_counter()
        for _ in range(steps):
            step()
        ms = (time.perf_counter() - began) / steps * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                step()
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    out = {"rows": rows, "cached_tokens": cached, "ms_per_step": round(ms, 2)}
    for part, names in PARTS.items():  # the profiler's own time per step of the part's kernels
        us = sum(t for key, t in self_us.items() if any(n in key for n in names))
        out[f"{part}_ms"] = round(us / steps / 1e3, 2)
    out["other_ms"] = round(ms - sum(out[f"{part}_ms"] for part in PARTS), 2)
    return out


def main(rows: list[int] = [1, 3, 8], cached: int = 800, steps: int = 20, dtype: str | None = None,  # noqa: B006
         threads: int = 2) -> None:  # fmt: skip
    """Args:
    rows: batch widths to time.
    cached: tokens already in the cache (a rollout's later calls hold ~800 in the bench's task).
    steps: timed steps per width (and as many profiled).
    dtype: ``bfloat16`` for the bf16 sampling copy; default fp32.
    threads: torch threads.
    """
    torch.set_num_threads(threads)
    module = make_module("smollm2-135m")
    engine = GenerationEngine(module.policy, [0], 0, replace(module.sampling, dtype=dtype))
    model = engine.sampler()
    result = {
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (the OpenMP runtime's default)"),
        "dtype": dtype or "float32",
        "threads": threads,
        "steps": [step_split(model, r, cached, steps) for r in rows],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    jsonargparse.CLI(main)
