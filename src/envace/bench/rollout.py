"""Rollout throughput: generated tokens per second of each role, a group batched vs one at a time.

* ``act``: the policy acts on a BFCL multi-turn task; the calls it makes (if any) are answered by
  the real environment, so every token the model generates is an act token.
* ``rehearse``: the gold calls are scripted (:class:`~envace.rollout.reference.OracleEngine`: the
  packaged model seldom writes a well-formed call) and the model writes every tool response
  (:class:`~envace.rollout.PolicyRehearsal`), so every token the model generates is a rehearse token.

``batched`` rolls out ``group_size`` episodes of the task together (one rollout); ``sequential``
rolls them out one rollout at a time. Rates are generated tokens over the engine's generation time
(``engine``) and over the rollout's wall time (``wall``).
"""

from __future__ import annotations

from typing import Any

import torch

from envace.bench.common import quiet, timed
from envace.rollout import (
    Engine,
    PolicyRehearsal,
    RealEnvironment,
    Responder,
    RolloutLimits,
    SamplingConfig,
    make_engine,
    make_rollout,
    summarize,
)
from envace.rollout.reference import OracleEngine
from envace.types import Task


def _run(module: Any, task: Task, role: str, episodes: int, group: int, sampling: SamplingConfig,
         max_new: int, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Roll out ``episodes`` episodes of ``task``, ``group`` per rollout, sampling from ``seed``;
    the model's engine stats. Seeded, so that a run and its variant (e.g. without row reuse)
    sample the same tokens and the figures repeat from one bench run to the next."""
    engine = make_engine(module.policy, module.tokenizer, module.fmt, sampling)
    actor: Engine
    responder: Responder
    if role == "act":
        actor, responder = engine, RealEnvironment()
        limits = RolloutLimits(max_steps_per_turn=1, max_new_tokens=max_new, max_episode_tokens=8192)
    else:
        actor, responder = OracleEngine(module.tokenizer, engine.stop_ids), PolicyRehearsal(max_new, engine=engine)
        limits = RolloutLimits(max_steps_per_turn=2, max_calls_per_step=16, max_episode_tokens=8192)
    rollout = make_rollout(actor, module.tokenizer, module.fmt, responder, limits)
    wall, roles = 0.0, {"act": 0, "rehearse": 0}
    torch.manual_seed(seed)
    with quiet():
        for _ in range(episodes // group):
            seconds, eps = timed(lambda: rollout.run([task], group))
            wall += seconds
            st = summarize(eps)
            roles["act"] += st.act_tokens
            roles["rehearse"] += st.rehearse_tokens
    return {
        "episodes": episodes,
        "tokens": engine.stats.tokens,
        "engine_seconds": round(engine.stats.seconds, 3),
        "wall_seconds": round(wall, 3),
        "tokens_per_s": round(engine.stats.tokens / engine.stats.seconds, 2) if engine.stats.seconds else 0.0,
        "wall_tokens_per_s": round(engine.stats.tokens / wall, 2) if wall else 0.0,
        "generate_calls": engine.stats.calls,
        "prompt_tokens": engine.stats.prompt_tokens,
        "prefill_tokens": engine.stats.prefill_tokens,
        "role_tokens": roles,
    }


def _pair(module: Any, task: Task, role: str, group: int, sequential: int, sampling: SamplingConfig,
          max_new: int) -> dict[str, Any]:  # fmt: skip
    """The role batched over a group and one episode at a time, and the ratio of their rates.

    The one-at-a-time episodes run half before and half after the batched group, so that a change
    in the machine's load during the measurement weighs on both sides.
    """
    before = _run(module, task, role, (sequential + 1) // 2, 1, sampling, max_new)
    batched = _run(module, task, role, group, group, sampling, max_new)
    single = _merge(before, _run(module, task, role, sequential // 2, 1, sampling, max_new, seed=1))
    return {
        "batched": batched,
        "sequential": single,
        "speedup": _ratio(batched["tokens_per_s"], single["tokens_per_s"]),
        "wall_speedup": _ratio(batched["wall_tokens_per_s"], single["wall_tokens_per_s"]),
    }


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two runs' counts added up, rates recomputed."""
    out = {k: a[k] + b[k] for k in ("episodes", "tokens", "engine_seconds", "wall_seconds", "generate_calls",
                                    "prompt_tokens", "prefill_tokens")}  # fmt: skip
    out["role_tokens"] = {r: a["role_tokens"][r] + b["role_tokens"][r] for r in a["role_tokens"]}
    out["tokens_per_s"] = round(out["tokens"] / out["engine_seconds"], 2) if out["engine_seconds"] else 0.0
    out["wall_tokens_per_s"] = round(out["tokens"] / out["wall_seconds"], 2) if out["wall_seconds"] else 0.0
    return out


def _both(pairs: dict[str, Any]) -> float | None:
    """Batched ÷ one-at-a-time rate over both roles' generated tokens together."""
    rate = {
        mode: sum(p[mode]["tokens"] for p in pairs.values()) / sum(p[mode]["engine_seconds"] for p in pairs.values())
        for mode in ("batched", "sequential")
    }
    return _ratio(rate["batched"], rate["sequential"])


def bench_rollout(
    module: Any, task: Task, group_size: int, sequential: int, act_tokens: int, rehearse_tokens: int
) -> dict[str, Any]:
    """Both roles batched and one at a time, in fp32 and with a bfloat16 sampling copy, and in fp32
    without prepacked weights (before/after); the batched rehearsal without row reuse (before/after)."""
    base = module.sampling
    settings = {
        "policy_weights": base,
        "bf16_sampling": SamplingConfig(**{**vars(base), "dtype": "bfloat16"}),
        "unpacked": SamplingConfig(**{**vars(base), "pack_weights": False}),
    }
    out: dict[str, Any] = {"task": task.id, "group_size": group_size, "user_turns": len(task.user_turns)}
    for key, sampling in settings.items():
        pairs = {
            "act": _pair(module, task, "act", group_size, sequential, sampling, act_tokens),
            "rehearse": _pair(module, task, "rehearse", group_size, sequential, sampling, rehearse_tokens),
        }
        out[key] = {**pairs, "both_roles_speedup": _both(pairs)}
    out["bf16_sampling"]["gain_batched"] = _gain_batched(out["bf16_sampling"], out["policy_weights"])
    out["unpacked"]["gain_batched"] = _gain_batched(out["policy_weights"], out["unpacked"])
    no_reuse = SamplingConfig(**{**vars(base), "reuse_rows": False})
    before = _run(module, task, "rehearse", group_size, group_size, no_reuse, rehearse_tokens)
    out["row_reuse"] = {
        "without": before,
        "speedup": _ratio(out["policy_weights"]["rehearse"]["batched"]["tokens_per_s"], before["tokens_per_s"]),
    }
    out["note"] = (
        "act: the model acts, the real environment answers its calls; rehearse: gold calls scripted by the "
        "oracle engine, every tool response written by the model; tokens_per_s = generated tokens / generation "
        "time; policy_weights samples in fp32, bf16_sampling in bfloat16, both through oneDNN-prepacked weights "
        "(sampling.pack_weights); unpacked: fp32 with the plain linear layers (before that change), gain_batched = "
        "packed / unpacked batched rate"
    )
    return out


def _gain_batched(faster: dict[str, Any], slower: dict[str, Any]) -> dict[str, float | None]:
    """Per role, the batched rate of one setting over another's."""
    return {role: _ratio(faster[role]["batched"]["tokens_per_s"], slower[role]["batched"]["tokens_per_s"])
            for role in ("act", "rehearse")}  # fmt: skip


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None
