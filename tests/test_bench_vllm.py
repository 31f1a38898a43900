"""The vLLM bench's log-prob mismatch: zero for what the trainer itself sampled, the gap where the
recorded log-probs are off (no server needed; the bench itself needs `make vllm`)."""

from __future__ import annotations

from typing import Any

import pytest

from envace.bench.vllm import default_dtypes, logprob_gap
from envace.data.sources import load_source
from envace.protocol.render import HermesFormat
from envace.rollout import RealEnvironment, RolloutLimits, SamplingConfig, make_engine, make_rollout


def test_logprob_gap_measures_the_recorded_against_a_fresh_forward(tiny_model: Any, tokenizer: Any) -> None:
    fmt = HermesFormat(tool_style="compact")
    task = load_source("bfcl-multi-turn", split="train", categories=["multi_turn_base"])[0].first_turns(1)
    engine = make_engine(tiny_model, tokenizer, fmt, SamplingConfig(temperature=0.7, pack_weights=False))
    episodes = make_rollout(engine, tokenizer, fmt, RealEnvironment(), RolloutLimits(max_new_tokens=8)).run(
        [task], 2, seeds=[0, 1]
    )
    own = logprob_gap(tiny_model, episodes, engine.pad_id, 0.7, "act")
    assert own["tokens"] == sum(e.role_tokens()["act"] for e in episodes) > 0
    assert own["max"] < 1e-4 and own["outside_clip_0.2"] == 0
    for e in episodes:  # a sampler whose log-probs are 0.5 off on every token
        e.builder.logprobs = [lp + 0.5 if r else lp for lp, r in zip(e.builder.logprobs, e.builder.roles, strict=True)]
    off = logprob_gap(tiny_model, episodes, engine.pad_id, 0.7, "act")
    assert logprob_gap(tiny_model, episodes, engine.pad_id, 0.7, "rehearse") == {"tokens": 0}  # none sampled
    assert off["max"] == pytest.approx(0.5, abs=1e-4) and off["mean"] == pytest.approx(0.5, abs=1e-4)
    assert off["outside_clip_0.2"] == 1.0  # |Δ| = 0.5 > log 1.2: every ratio leaves the clip band


def test_bf16_is_measured_only_where_native() -> None:
    assert default_dtypes(False) == ("float32",) and default_dtypes(True) == ("float32", "bfloat16")
