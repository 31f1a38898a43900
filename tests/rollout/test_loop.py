"""The rollout loop: tokens out are exactly the sampled ids, log-probs match a fresh forward, and
every limit, responder and error path ends where it should."""

from __future__ import annotations

import pytest
import torch

from envace.data.grounding import ground
from envace.data.sources import load_source
from envace.protocol.render import HermesFormat
from envace.rewards import compute_reward
from envace.rollout import (
    ExternalSimulator,
    GenerationEngine,
    PolicyRehearsal,
    RealEnvironment,
    Replay,
    RolloutLimits,
    SamplingConfig,
    make_engine,
    make_rollout,
)
from envace.rollout.reference import NoopEngine, OracleEngine, ScriptedEngine
from envace.rollout.responders import ToolTurn
from envace.types import ROLE_IDS, CallRecord, Task, ToolCall

FMT = HermesFormat(tool_style="compact")


@pytest.fixture(scope="module")
def bfcl_tasks() -> dict[str, Task]:
    tasks = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])
    return {t.id: t for t in tasks}


class Recording:
    """Wraps an engine and keeps every sample it returned, per episode."""

    def __init__(self, engine):
        self.engine, self.stats, self.instant, self.samples = engine, engine.stats, engine.instant, {}

    def reset_cache(self):
        self.engine.reset_cache()

    def stream(self, requests, follow):
        def keep(request, sample):
            self.samples.setdefault(id(request.episode), []).append(sample)
            return follow(request, sample)

        self.engine.stream(requests, keep)


def _fresh_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    return torch.cat([torch.zeros(1), lp])  # position t holds log p(ids[t] | ids[:t])


def test_sampled_ids_and_logprobs_are_exact(tokenizer, tiny_model, bfcl_tasks) -> None:
    torch.manual_seed(0)
    task = bfcl_tasks["multi_turn_base_0"]
    sampler = Recording(make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16)))
    oracle = Recording(OracleEngine(tokenizer, sampler.engine.stop_ids))  # scripted acts make calls to rehearse
    rollout = make_rollout(
        oracle,
        tokenizer,
        FMT,
        PolicyRehearsal(engine=sampler),
        RolloutLimits(max_new_tokens=32, max_rehearse_tokens=24),
    )
    episodes = rollout.run([task], group_size=2)
    for ep in episodes:
        t = ep.tensors()
        rehearse = t.roles == ROLE_IDS["rehearse"]
        written = [i for s in sampler.samples[id(ep)] for i in s.ids]
        assert rehearse.sum() > 0 and t.input_ids[rehearse].tolist() == written  # tokens out, exactly
        fresh = _fresh_logprobs(tiny_model, t.input_ids.tolist())
        # sampled with a shared-prefix KV cache and left padding vs one unpadded forward: fp32 noise only
        torch.testing.assert_close(t.logprobs[rehearse], fresh[rehearse], atol=1e-4, rtol=0)
        assert ep.flags <= {"truncated", "max_steps"}

    # and with the model acting: every act id is a sampled id, log-probs match
    actor = Recording(make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16)))
    ep = make_rollout(actor, tokenizer, FMT, PolicyRehearsal(),
                      RolloutLimits(max_new_tokens=12, max_rehearse_tokens=16)).run([task], 1)[0]  # fmt: skip
    t = ep.tensors()
    act = t.roles == ROLE_IDS["act"]
    assert t.input_ids[act].tolist() == [i for s in actor.samples[id(ep)] for i in s.ids]
    torch.testing.assert_close(
        t.logprobs[act], _fresh_logprobs(tiny_model, t.input_ids.tolist())[act], atol=1e-4, rtol=0
    )


def test_an_episode_samples_the_same_tokens_alone_or_in_a_group(tokenizer, tiny_model, bfcl_tasks) -> None:
    task = bfcl_tasks["multi_turn_base_1"]

    def roll(seeds: list[int]) -> list[list[int]]:
        engine = make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16))
        oracle = OracleEngine(tokenizer, engine.stop_ids)  # the policy rehearses every gold call
        rollout = make_rollout(oracle, tokenizer, FMT, PolicyRehearsal(engine=engine),
                               RolloutLimits(max_rehearse_tokens=12))  # fmt: skip
        return [ep.ids for ep in rollout.run([task], len(seeds), seeds=seeds)]

    seeds = [11, 12, 13, 14]
    together = roll(seeds)
    assert len({tuple(ids) for ids in together}) == len(seeds)  # different streams, different episodes
    assert together == [roll([s])[0] for s in seeds]  # each one as it samples alone
    rollout = make_rollout(OracleEngine(tokenizer, [0]), tokenizer, FMT, PolicyRehearsal())
    with pytest.raises(ValueError, match="4 episodes but 3 seeds"):
        rollout.run([task], 4, seeds=seeds[:3])


def test_continuous_and_lockstep_rollouts_sample_the_same_episodes(tokenizer, tiny_model, bfcl_tasks) -> None:
    """With continuous batching an episode's next turn joins the rows still decoding; its tokens stay
    those of its own stream, in fewer forwards."""
    tasks = [bfcl_tasks["multi_turn_base_1"], bfcl_tasks["multi_turn_base_2"]]
    limits = RolloutLimits(max_steps_per_turn=2, max_new_tokens=24, max_rehearse_tokens=12)

    def roll(continuous: bool) -> tuple[list[list[int]], GenerationEngine]:
        engine = make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16, continuous=continuous))
        engine.stop_ids = list(range(0, 49152, 8))  # an eighth of the ids end a turn: turns end at different steps
        rollout = make_rollout(engine, tokenizer, FMT, PolicyRehearsal(), limits)
        return [ep.ids for ep in rollout.run(tasks, 3, seeds=list(range(6)))], engine

    joined, engine = roll(continuous=True)
    lockstep, other = roll(continuous=False)
    assert joined == lockstep
    assert engine.stats.tokens == other.stats.tokens and engine.stats.steps < other.stats.steps


def test_an_external_simulator_answers_every_call_as_context(tokenizer, tiny_model, bfcl_tasks) -> None:
    """Two engines in one rollout: the oracle acts at once, a separate model writes each response from
    its simulator prompt (context, not trained on); every gold call gets its turn."""
    task = bfcl_tasks["multi_turn_base_1"]
    engine = make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16))
    simulator = ExternalSimulator(engine, tokenizer=tokenizer, prompt="separate")
    rollout = make_rollout(OracleEngine(tokenizer, engine.stop_ids), tokenizer, FMT, simulator,
                           RolloutLimits(max_rehearse_tokens=6))  # fmt: skip
    episodes = rollout.run([task], 2, seeds=[1, 2])
    calls = sum(len(turn) for turn in task.gold)
    for ep in episodes:
        assert [r.call for r in ep.calls] == [c for turn in task.gold for c in turn]
        assert ep.writers == ["simulator"] * calls
        assert ep.role_tokens()["rehearse"] == 0 and not ep.flags
    assert 2 * calls <= engine.stats.tokens <= 2 * calls * 6  # one simulated response per call


def test_an_inline_simulator_writes_what_rehearsal_writes_as_context(tokenizer, tiny_model, bfcl_tasks) -> None:
    """Like for like: a simulator with the policy's own weights, inline, writes the same tokens in the same
    places as the policy's rehearsal (same context, format, budget and random stream); only their role
    differs: context, so no loss reaches the simulator or the policy through them."""
    task = bfcl_tasks["multi_turn_base_1"]
    stop = list(range(0, 49152, 4))  # a quarter of the ids end a turn: responses end inside the budget
    limits = RolloutLimits(max_rehearse_tokens=12)

    def run(responder):
        engine = make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16))
        engine.stop_ids = stop
        rollout = make_rollout(OracleEngine(tokenizer, stop), tokenizer, FMT, responder(engine), limits)
        return rollout.run([task], 2, seeds=[1, 2])

    rehearsed, simulated = run(PolicyRehearsal), run(ExternalSimulator)
    for r, s in zip(rehearsed, simulated, strict=True):
        assert r.ids == s.ids and len(s.calls) >= 2
        assert r.writers == ["policy"] * len(r.calls) and s.writers == ["simulator"] * len(s.calls)
        assert r.role_tokens()["rehearse"] > 0 and s.role_tokens()["rehearse"] == 0
        assert s.role_tokens()["act"] == r.role_tokens()["act"]
    other = type("Other", (), {"get_vocab": lambda self: {"a": 0}})()
    with pytest.raises(ValueError, match="policy's tokenizer"):
        ExternalSimulator(make_engine(tiny_model, tokenizer, FMT), tokenizer=other).bind(None, tokenizer)


def test_oracle_with_real_environment_reproduces_grounding(tokenizer, bfcl_tasks) -> None:
    task = bfcl_tasks["multi_turn_base_1"]
    oracle = OracleEngine(tokenizer, [tokenizer.eos_token_id])
    limits = RolloutLimits(max_calls_per_step=16, max_episode_tokens=100_000)
    ep = make_rollout(oracle, tokenizer, FMT, RealEnvironment(), limits, lockstep=True).run([task], 1)[0]
    grounded = ground(task)
    assert [c.call for c in ep.calls] == [c.call for c in grounded.calls]
    assert [c.response for c in ep.calls] == [c.response for c in grounded.calls]
    assert compute_reward(task, ep.trajectory()).score == 1.0
    # lockstep: a second real environment sees the same calls: fidelity is exactly 1 on every call
    assert len(ep.fidelity) == len(ep.calls) and all(p.rehearsed == p.real for p in ep.fidelity)
    assert not ep.flags and ep.turn == len(task.user_turns) - 1


def test_noop_scores_zero_and_ends_after_the_script(tokenizer, bfcl_tasks) -> None:
    task = bfcl_tasks["multi_turn_base_2"]
    ep = make_rollout(NoopEngine(tokenizer, [2]), tokenizer, FMT, PolicyRehearsal()).run([task], 1)[0]
    assert ep.calls == [] and ep.turn == len(task.user_turns) - 1 and ep.done and not ep.flags
    assert compute_reward(task, ep.trajectory()).score == 0.0
    assert (ep.tensors().roles == ROLE_IDS["rehearse"]).sum() == 0


class Always(ScriptedEngine):
    def __init__(self, tokenizer, text):
        super().__init__(tokenizer, [tokenizer.eos_token_id])
        self.text = text

    def text_for(self, episode):
        return self.text


def test_limits_end_episodes_with_flags(tokenizer, bfcl_tasks) -> None:
    task = bfcl_tasks["multi_turn_base_0"]
    call = '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>'
    ep = make_rollout(
        Always(tokenizer, call), tokenizer, FMT, RealEnvironment(), RolloutLimits(max_steps_per_turn=3)
    ).run([task], 1)[0]
    assert ep.flags == {"max_steps"} and len(ep.calls) == 3 and ep.turn == 0
    many = call * 3
    ep = make_rollout(Always(tokenizer, many), tokenizer, FMT, RealEnvironment(), RolloutLimits(max_calls_per_step=2,
                      max_steps_per_turn=1)).run([task], 1)[0]  # fmt: skip
    assert len(ep.calls) == 2 and ep.format_errors == 1
    prompt = len(tokenizer(FMT.system(task.system_prompt, task.tools) + FMT.user(task.user_turns[0])).input_ids)
    tight = RolloutLimits(max_new_tokens=16, max_episode_tokens=prompt + 20)  # no room for a second act
    ep = make_rollout(Always(tokenizer, "hi"), tokenizer, FMT, RealEnvironment(), tight).run([task], 1)[0]
    assert ep.flags == {"max_episode_tokens"} and ep.turn == 1  # turn 1 began; its act found no room
    assert len(ep.messages) == 3  # user, assistant "hi", user


def test_a_response_longer_than_the_episode_budget_ends_the_episode_unappended(tokenizer, bfcl_tasks) -> None:
    """A real environment's response can be any length (BFCL long-context classes): one that does not fit
    ends the episode with the limit's flag instead of growing it past its budget (it OOM-killed a
    real_env fit on 24 GB); the call is still recorded."""

    class Huge(RealEnvironment):
        def respond(self, episodes, calls):
            return [ToolTurn({"data": "lorem ipsum " * 5000}, writer="environment") for _ in calls]

    task = bfcl_tasks["multi_turn_base_0"]
    call = '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>'
    limits = RolloutLimits(max_episode_tokens=3000)
    ep = make_rollout(Always(tokenizer, call), tokenizer, FMT, Huge(), limits).run([task], 1)[0]
    assert ep.flags == {"max_episode_tokens"} and len(ep.ids) <= 3000 and len(ep.calls) == 1
    small = make_rollout(Always(tokenizer, call), tokenizer, FMT, RealEnvironment(), limits).run([task], 1)[0]
    assert "max_episode_tokens" not in small.flags or len(small.calls) > 1


def test_truncated_generation_is_flagged(tokenizer, tiny_model, bfcl_tasks) -> None:
    torch.manual_seed(0)
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2)  # never stops
    ep = make_rollout(engine, tokenizer, FMT, PolicyRehearsal(), RolloutLimits(max_new_tokens=5)).run(
        [bfcl_tasks["multi_turn_base_0"]], 2
    )[0]
    assert ep.flags == {"truncated"} and (ep.tensors().roles == ROLE_IDS["act"]).sum() == 5


def test_invalid_calls_get_structured_errors_as_context(tokenizer, bfcl_tasks) -> None:
    task = bfcl_tasks["multi_turn_base_0"]
    bad = '<tool_call>{"name": "format_disk", "arguments": {}}</tool_call><tool_call>{oops</tool_call>'
    ep = make_rollout(
        Always(tokenizer, bad), tokenizer, FMT, PolicyRehearsal(), RolloutLimits(max_steps_per_turn=1)
    ).run([task], 1)[0]
    assert ep.format_errors == 2 and ep.calls == []
    text = ep.builder.text()
    assert '"code": "UNKNOWN_TOOL"' in text and '"code": "CALL_JSON_DECODE_ERROR"' in text
    assert (ep.tensors().roles == ROLE_IDS["rehearse"]).sum() == 0  # errors are context, not rehearsals


def test_replay_matches_by_name_and_arguments(tokenizer) -> None:
    tools = [{"name": "quote", "parameters": {"type": "object", "properties": {"s": {"type": "string"}}}}]
    recorded = [
        CallRecord(ToolCall("quote", {"s": "A"}), {"p": 1}),
        CallRecord(ToolCall("quote", {"s": "B"}), {"p": 2}),
    ]
    task = Task(id="r", benchmark="finmcp", tools=tools, user_turns=["go"], recorded=recorded)
    calls = "".join(f'<tool_call>{{"name": "quote", "arguments": {{"s": "{s}"}}}}</tool_call>' for s in "BZZ")
    ep = make_rollout(Always(tokenizer, calls), tokenizer, FMT, Replay(), RolloutLimits(max_steps_per_turn=1)).run(
        [task], 1
    )[0]
    miss = {"error": {"code": "REPLAY_MISS", "message": "no recorded response for quote"}}
    assert [c.response for c in ep.calls] == [{"p": 2}, {"p": 1}, miss]
