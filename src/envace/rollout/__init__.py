"""The world-rehearsal rollout: batched generation, responders, the episode loop, reference policies."""

from __future__ import annotations

from typing import Any

from envace.protocol.render import ChatFormat
from envace.protocol.tokens import PieceEncoder
from envace.rollout.engine import Engine, GenerationEngine, SamplingConfig, SamplingEngine
from envace.rollout.episode import Episode, FidelityPair, RolloutResult, RolloutStats, summarize
from envace.rollout.loop import Job, Rollout, RolloutLimits, drive, run_together
from envace.rollout.responders import (
    ExternalSimulator,
    PolicyRehearsal,
    RealEnvironment,
    Rehearsal,
    Replay,
    Responder,
)

__all__ = [
    "Engine",
    "Episode",
    "ExternalSimulator",
    "FidelityPair",
    "GenerationEngine",
    "Job",
    "PolicyRehearsal",
    "RealEnvironment",
    "Rehearsal",
    "Replay",
    "Responder",
    "Rollout",
    "RolloutLimits",
    "RolloutResult",
    "RolloutStats",
    "SamplingConfig",
    "SamplingEngine",
    "drive",
    "make_engine",
    "make_rollout",
    "run_together",
    "stop_ids",
    "summarize",
]


def stop_ids(tokenizer: Any, fmt: ChatFormat) -> list[int]:
    """The ids that end a turn: the format's end marker (and the tokenizer's eos)."""
    ids = tokenizer(fmt.assistant().end, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"the end-of-turn marker {fmt.assistant().end!r} must be one token, got {ids}")
    return sorted({ids[0], *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])})


def make_engine(model: Any, tokenizer: Any, fmt: ChatFormat, sampling: SamplingConfig | None = None) -> SamplingEngine:
    """A sampling engine over ``model`` that stops at the format's end-of-turn token: ours, or with
    ``sampling.engine: vllm`` a vLLM server's (started, or attached at ``sampling.vllm.url``)."""
    sampling = sampling or SamplingConfig()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if sampling.engine == "vllm":
        from envace.rollout.engine.vllm.engine import VLLMEngine

        return VLLMEngine.create(model, tokenizer, stop_ids(tokenizer, fmt), pad, sampling)
    return GenerationEngine(model, stop_ids(tokenizer, fmt), pad, sampling)


def make_rollout(
    engine: Engine, tokenizer: Any, fmt: ChatFormat, responder: Responder, limits: RolloutLimits | None = None,
    **kw: Any,
) -> Rollout:  # fmt: skip
    """A :class:`Rollout` with a fresh piece encoder over ``tokenizer``."""
    return Rollout(engine, fmt, PieceEncoder(tokenizer), responder, limits, **kw)
