"""Rollout throughput: generated tokens per second of each role, a group batched vs one at a time.

* ``act``: the policy acts on a BFCL multi-turn task; the calls it makes (if any) are answered by
  the real environment, so every token the model generates is an act token.
* ``rehearse``: the gold calls are scripted (:class:`~envace.rollout.reference.OracleEngine`: the
  packaged model seldom writes a well-formed call) and the model writes every tool response
  (:class:`~envace.rollout.PolicyRehearsal`), so every token the model generates is a rehearse token.

``batched`` rolls out ``group_size`` episodes of the task together (one rollout); ``sequential``
rolls the same episodes out one rollout at a time. Every episode samples from its own seeded
stream (``Rollout.run(seeds=...)``), so both sides generate the same tokens (``identical_episodes``
counts those that match exactly; float rounding between batch shapes can flip a rare draw) and the
ratio compares the same work. Rates are generated tokens over the engine's generation time
(``engine``) and over the rollout's wall time (``wall``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

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
from envace.types import ROLE_IDS, Task


def _run(module: Any, task: Task, role: str, seeds: list[int], group: int, sampling: SamplingConfig,
         max_new: int, engine: Any = None) -> dict[str, Any]:  # fmt: skip
    """Roll out one episode of ``task`` per seed, ``group`` per rollout (with ``engine``, else a fresh
    one over the module's policy); the model's engine stats, and (``episode_tokens`` and
    ``episode_list``, not for the JSON) the tokens each episode generated and the episodes."""
    engine = engine or make_engine(module.policy, module.tokenizer, module.fmt, sampling)
    actor: Engine
    responder: Responder
    if role == "act":
        actor, responder = engine, RealEnvironment()
        limits = RolloutLimits(max_steps_per_turn=1, max_new_tokens=max_new, max_episode_tokens=8192)
    else:
        actor, responder = OracleEngine(module.tokenizer, engine.stop_ids), PolicyRehearsal(engine=engine)
        limits = RolloutLimits(max_steps_per_turn=2, max_calls_per_step=16, max_rehearse_tokens=max_new,
                               max_episode_tokens=8192)  # fmt: skip
    rollout = make_rollout(actor, module.tokenizer, module.fmt, responder, limits)
    wall, roles, generated, episodes = 0.0, {"act": 0, "rehearse": 0}, [], []
    with quiet():
        for start in range(0, len(seeds), group):
            chunk = seeds[start : start + group]
            seconds, eps = timed(partial(rollout.run, [task], len(chunk), seeds=chunk))
            wall += seconds
            episodes += eps
            st = summarize(eps)
            roles["act"] += st.act_tokens
            roles["rehearse"] += st.rehearse_tokens
            generated += [[i for i, r in zip(e.ids, e.builder.roles, strict=True) if r == ROLE_IDS[role]] for e in eps]
    return {
        "episodes": len(seeds),
        "tokens": engine.stats.tokens,
        "engine_seconds": round(engine.stats.seconds, 3),
        "wall_seconds": round(wall, 3),
        "tokens_per_s": round(engine.stats.tokens / engine.stats.seconds, 2) if engine.stats.seconds else 0.0,
        "wall_tokens_per_s": round(engine.stats.tokens / wall, 2) if wall else 0.0,
        "generate_calls": engine.stats.calls,
        "decode_steps": engine.stats.steps,
        "tokens_per_step": round(engine.stats.tokens / engine.stats.steps, 2) if engine.stats.steps else 0.0,
        "prompt_tokens": engine.stats.prompt_tokens,
        "prefill_tokens": engine.stats.prefill_tokens,
        "role_tokens": roles,
        "episode_tokens": generated,
        "episode_list": episodes,
    }


def role_pair(module: Any, task: Task, role: str, group: int, sampling: SamplingConfig, max_new: int) -> dict[str, Any]:
    """The role's ``group`` episodes batched and the same episodes one at a time, and the ratio of
    their rates.

    Half of the one-at-a-time episodes run before the batched group and half after, so that a change
    in the machine's load during the measurement weighs on both sides.
    """
    seeds = list(range(group))
    half = (group + 1) // 2
    before = _run(module, task, role, seeds[:half], 1, sampling, max_new)
    batched = _run(module, task, role, seeds, group, sampling, max_new)
    single = _merge(before, _run(module, task, role, seeds[half:], 1, sampling, max_new))
    batched.pop("episode_list")
    same = sum(a == b for a, b in zip(batched.pop("episode_tokens"), single.pop("episode_tokens"), strict=True))
    return {
        "batched": batched,
        "sequential": single,
        "identical_episodes": same,
        "speedup": _ratio(batched["tokens_per_s"], single["tokens_per_s"]),
        "wall_speedup": _ratio(batched["wall_tokens_per_s"], single["wall_tokens_per_s"]),
    }


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two runs' counts added up (episodes in order), rates recomputed."""
    out = {k: a[k] + b[k] for k in ("episodes", "tokens", "engine_seconds", "wall_seconds", "generate_calls",
                                    "decode_steps", "prompt_tokens", "prefill_tokens", "episode_tokens")}  # fmt: skip
    out["role_tokens"] = {r: a["role_tokens"][r] + b["role_tokens"][r] for r in a["role_tokens"]}
    out["tokens_per_s"] = round(out["tokens"] / out["engine_seconds"], 2) if out["engine_seconds"] else 0.0
    out["wall_tokens_per_s"] = round(out["tokens"] / out["wall_seconds"], 2) if out["wall_seconds"] else 0.0
    out["tokens_per_step"] = round(out["tokens"] / out["decode_steps"], 2) if out["decode_steps"] else 0.0
    return out


def _both(pairs: dict[str, Any]) -> float | None:
    """Batched ÷ one-at-a-time rate over both roles' generated tokens together."""
    rate = {
        mode: sum(p[mode]["tokens"] for p in pairs.values()) / sum(p[mode]["engine_seconds"] for p in pairs.values())
        for mode in ("batched", "sequential")
    }
    return _ratio(rate["batched"], rate["sequential"])


def bench_rollout(
    module: Any, task: Task, group_size: int, act_tokens: int, rehearse_tokens: int, bf16_sampling: bool = True
) -> dict[str, Any]:
    """Both roles batched and one at a time, in fp32 and (``bf16_sampling``: where the CPU computes
    bf16 natively) with a bfloat16 sampling copy, and in fp32 without prepacked weights
    (before/after); the batched rehearsal without row reuse and without sharing identical prompts'
    prefill, and both roles' batches in lockstep instead of continuous batching (before/after each)."""
    base = module.sampling
    settings = {
        "policy_weights": base,
        "bf16_sampling": SamplingConfig(**{**vars(base), "dtype": "bfloat16"}),
        "unpacked": SamplingConfig(**{**vars(base), "pack_weights": False}),
    }
    out: dict[str, Any] = {"task": task.id, "group_size": group_size, "user_turns": len(task.user_turns)}
    if not bf16_sampling:
        del settings["bf16_sampling"]
        out["bf16_sampling"] = {"skipped": "no native bf16 on this CPU (envace.hardware): ~100x slower than fp32"}
    for key, sampling in settings.items():
        pairs = {
            "act": role_pair(module, task, "act", group_size, sampling, act_tokens),
            "rehearse": role_pair(module, task, "rehearse", group_size, sampling, rehearse_tokens),
        }
        out[key] = {**pairs, "both_roles_speedup": _both(pairs)}
    if bf16_sampling:
        out["bf16_sampling"]["gain_batched"] = _gain_batched(out["bf16_sampling"], out["policy_weights"])
    out["unpacked"]["gain_batched"] = _gain_batched(out["policy_weights"], out["unpacked"])

    def before(role: str, change: dict[str, Any], budget: int) -> tuple[dict[str, Any], float | None]:
        """The role's batched group with ``change`` to the sampling, and the fp32 batched rate over it."""
        run = _run(module, task, role, list(range(group_size)), group_size, SamplingConfig(**{**vars(base), **change}),
                   budget)  # fmt: skip
        run.pop("episode_tokens")
        run.pop("episode_list")
        return run, _ratio(out["policy_weights"][role]["batched"]["tokens_per_s"], run["tokens_per_s"])

    for key, off in {"row_reuse": "reuse_rows", "identical_prompts": "share_identical"}.items():
        without, speedup = before("rehearse", {off: False}, rehearse_tokens)
        out[key] = {"without": without, "speedup": speedup}
    out["continuous"] = {}
    for role, budget in {"act": act_tokens, "rehearse": rehearse_tokens}.items():
        lockstep, speedup = before(role, {"continuous": False}, budget)
        out["continuous"][role] = {"lockstep": lockstep, "speedup": speedup}
    out["note"] = (
        "act: the model acts, the real environment answers its calls; rehearse: gold calls scripted by the "
        "oracle engine, every tool response written by the model; sequential = the batched group's episodes "
        "(same seeded streams) one at a time; tokens_per_s = generated tokens / generation time; tokens_per_step = "
        "generated tokens per model forward (how full the batch ran); policy_weights "
        "samples in fp32, bf16_sampling in bfloat16, both through oneDNN-prepacked weights "
        "(sampling.pack_weights); unpacked: fp32 with the plain linear layers (before that change), gain_batched = "
        "packed / unpacked batched rate; continuous: the batched group with continuous batching (an episode's next "
        "generation joins the rows still decoding) over lockstep (sampling.continuous=false: the next generations "
        "wait for the whole batch to end); generate_calls counts prefills"
    )
    return out


def _gain_batched(faster: dict[str, Any], slower: dict[str, Any]) -> dict[str, float | None]:
    """Per role, the batched rate of one setting over another's."""
    return {role: _ratio(faster[role]["batched"]["tokens_per_s"], slower[role]["batched"]["tokens_per_s"])
            for role in ("act", "rehearse")}  # fmt: skip


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None
