"""Committed validation's official scorers: BFCL's multi_turn_checker per task and per turn prefix,
tau2's own evaluator, none elsewhere."""

from __future__ import annotations

from envace.data.sources import load_source
from envace.evaluation.official import official_score
from envace.protocol.render import HermesFormat
from envace.rewards.base import RewardOutput
from envace.rollout import Episode, RealEnvironment, RolloutLimits, make_rollout
from envace.rollout.reference import NoopEngine, OracleEngine
from envace.types import Task

FMT = HermesFormat(tool_style="compact")
LIMITS = RolloutLimits(max_new_tokens=4096, max_calls_per_step=32, max_episode_tokens=10**6)


def _run(engine_cls, tokenizer, tasks: list[Task]) -> list[Episode]:
    engine = engine_cls(tokenizer, [tokenizer.eos_token_id])
    return make_rollout(engine, tokenizer, FMT, RealEnvironment(), LIMITS, validate_calls=False).run(tasks, 1)


def _score(ep: Episode) -> RewardOutput:
    out = official_score(ep)
    assert out is not None
    return out


def test_bfcl_gold_passes_every_turn_and_silence_none(tokenizer) -> None:
    task = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])[0].first_turns(2)
    gold = _score(_run(OracleEngine, tokenizer, [task])[0])
    assert gold.success and gold.details["turn_score"] == 1.0 and gold.details["turns_passed"] == 2
    silent = _score(_run(NoopEngine, tokenizer, [task])[0])
    assert not silent.success and silent.details["turns_passed"] == 0 and silent.details["turn_score"] == 0.0


def test_bfcl_per_turn_counts_the_turns_before_the_first_failure(tokenizer) -> None:
    task = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])[0].first_turns(2)
    ep = _run(OracleEngine, tokenizer, [task])[0]
    second_user = [i for i, m in enumerate(ep.messages) if m.role == "user"][1]
    ep.messages = ep.messages[: second_user + 1]  # the second turn's gold calls are dropped
    out = _score(ep)
    assert not out.success and out.details["turns_passed"] == 1 and out.details["turn_score"] == 0.5


def test_tau2_uses_its_evaluator_and_others_have_none(tokenizer) -> None:
    task = next(t for t in load_source("tau2", split="train") if t.id == "airline_1")
    out = _score(_run(OracleEngine, tokenizer, [task])[0])
    assert out.success and out.details["breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    other = Task("x", "finmcp")
    assert official_score(Episode(task=other, builder=None, group=0)) is None  # type: ignore[arg-type]
