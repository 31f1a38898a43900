"""Test-time imagination: imagined attempts start from the committed ids, generate together, are
condensed into a note placed before the committed act, and are counted apart from committed tokens."""

from __future__ import annotations

import pytest
import torch

from envace.data.sources import load_source
from envace.inference import Attempt, ImaginationConfig, fork, imagining_rollout, render_memory, token_counts
from envace.protocol.render import HermesFormat
from envace.protocol.tokens import PieceEncoder
from envace.rollout import RealEnvironment, Rollout, RolloutLimits, SamplingConfig, make_engine
from envace.rollout.reference import ScriptedEngine
from envace.types import CallRecord, Task, ToolCall

FMT = HermesFormat(tool_style="compact")
TOOL_HEADER = "<|im_start|>tool\n"
IMAGINED = '<execution_result>{"current_working_directory": "/imagined"}</execution_result>'


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])[:2]


@pytest.fixture(scope="module")
def short() -> list[Task]:
    """Two tasks with short prompts (TradingBot only, ~620 tokens) for the sampled tests."""
    wanted = ("multi_turn_base_105", "multi_turn_base_146")
    return [t for t in load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"]) if t.id in wanted]


class Scripted(ScriptedEngine):
    """Acts ``pwd`` then a closing text per turn; rehearses a fixed result; records every batch (it
    stands in for a sampling engine: batched with the other episodes, not written at once)."""

    instant = False

    def __init__(self, tokenizer):
        super().__init__(tokenizer, [tokenizer.eos_token_id])
        self.batches: list[list[str]] = []

    def write(self, requests):
        self.batches.append([self.tokenizer.decode(r.prompt) for r in requests])
        return super().write(requests)

    def text_for(self, episode):
        if episode.builder.text().endswith(TOOL_HEADER):
            return IMAGINED
        return '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>' if episode.steps_in_turn == 0 else "All set."


def _rollout(engine, tokenizer, mode: str, n: int, limits: RolloutLimits | None = None) -> Rollout:
    return imagining_rollout(engine, tokenizer, FMT, RealEnvironment(), limits, ImaginationConfig(mode, n))


def test_settings_of_a_sweep() -> None:
    sweep = ImaginationConfig(n_values=[4, 0, 2], modes=["parallel", "sequential"]).settings()
    assert [(s.mode, s.n) for s in sweep] == [("none", 0), ("parallel", 2), ("sequential", 2), ("parallel", 4),
                                              ("sequential", 4)]  # fmt: skip
    assert [(s.mode, s.n) for s in ImaginationConfig("sequential", 3).settings()] == [("sequential", 3)]


def test_fork_copies_the_committed_episode(tokenizer, tasks) -> None:
    ro = _rollout(Scripted(tokenizer), tokenizer, "none", 0)
    ep = ro.start(tasks[0], 0)
    im = fork(ep)
    assert im.ids == ep.ids and im.builder.roles == ep.builder.roles and im.env is None and im.turn == ep.turn
    im.builder.context("more")
    im.messages.append(im.messages[0])
    assert len(im.ids) > len(ep.ids) and len(im.messages) == len(ep.messages) + 1


def test_parallel_attempts_batch_and_the_note_precedes_the_committed_act(tokenizer, tasks) -> None:
    engine = Scripted(tokenizer)
    episodes = _rollout(engine, tokenizer, "parallel", 3, RolloutLimits(max_steps_per_turn=3)).run(tasks[:2])
    # first call: the 2 episodes x 3 attempts act together, starting from the committed prompt
    assert len(engine.batches[0]) == 6
    assert all(p.endswith("<|im_start|>assistant\n") and "Private rehearsal" not in p for p in engine.batches[0])
    # then every imagined pwd is rehearsed by the policy, in one batch
    assert len(engine.batches[1]) == 6 and all(p.endswith(TOOL_HEADER) for p in engine.batches[1])
    for ep in episodes:
        records = ep.imagined
        assert [r.turn for r in records] == list(range(len(ep.task.user_turns)))
        first = records[0]
        assert len(first.attempts) == 3
        assert all(a.calls == [CallRecord(ToolCall("pwd"), {"current_working_directory": "/imagined"})]
                   and a.outcome == "All set." for a in first.attempts)  # fmt: skip
        text = ep.builder.text()
        note = text.index("Private rehearsal")
        user0 = text.index(ep.task.user_turns[0])
        first_act = text.index("<|im_start|>assistant\n", user0)
        assert user0 < note < first_act  # user turn, note, then the committed act
        assert 'pwd({}) -> {"current_working_directory": "/imagined"}' in text
        # committed execution is real: the committed pwd got the real environment's answer
        assert ep.calls[0].response != {"current_working_directory": "/imagined"}
        counts = token_counts(ep)
        assert counts.imagined == sum(r.tokens for r in records) > 0
        assert counts.committed == ep.role_tokens()["act"] and counts.memory == sum(r.memory_tokens for r in records)
        assert ep.role_tokens()["rehearse"] == 0  # imagined tokens never enter the committed episode


def test_sequential_attempt_sees_the_memory_of_earlier_ones(tokenizer, tasks) -> None:
    engine = Scripted(tokenizer)
    ep = _rollout(engine, tokenizer, "sequential", 2, RolloutLimits(max_steps_per_turn=3)).run(tasks[:1])[0]
    acts = [b for b in engine.batches if b[0].endswith("<|im_start|>assistant\n")]
    assert "Private rehearsal" not in acts[0][0]  # attempt 1: the committed context only
    second = next(b[0] for b in acts[1:] if "Attempt 1:" in b[0])  # attempt 2 reads attempt 1's note
    assert "Attempt 2:" not in second
    assert len(ep.imagined[0].attempts) == 2 and "Attempt 2:" in ep.builder.text()


def test_zero_rehearsals_is_plain_execution(tokenizer, tiny_model, short) -> None:
    limits = RolloutLimits(max_new_tokens=6, max_steps_per_turn=2)
    runs = []
    for cls in ("plain", "rehearsing"):
        torch.manual_seed(0)
        engine = make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16))
        if cls == "plain":
            ro = Rollout(engine, FMT, PieceEncoder(tokenizer), RealEnvironment(), limits)
        else:
            ro = _rollout(engine, tokenizer, "parallel", 0, limits)
        runs.append([e.ids for e in ro.run(short)])
    assert runs[0] == runs[1]


def test_sampled_attempts_count_their_tokens(tokenizer, tiny_model, short) -> None:
    torch.manual_seed(0)
    engine = make_engine(tiny_model, tokenizer, FMT, SamplingConfig(min_prefix=16))
    limits = RolloutLimits(max_new_tokens=6, max_steps_per_turn=1)
    eps = _rollout(engine, tokenizer, "parallel", 2, limits).run(short[:1])
    rec = eps[0].imagined[0]
    assert [a.tokens for a in rec.attempts] == [6, 6] and all("truncated" in a.flags for a in rec.attempts)
    assert token_counts(eps[0]).imagined == 12


def test_memory_lists_calls_results_outcome_and_errors() -> None:
    bad = CallRecord(ToolCall("mv", {"source": "a" * 500}), {"error": {"code": "NO_TAG", "message": "x"}})
    text = render_memory([Attempt([bad], "", format_errors=1, flags=["max_steps"]), Attempt(outcome="Nothing to do.")],
                         max_chars=40)  # fmt: skip
    assert "Attempt 1:" in text and "Attempt 2:" in text and "(no tool calls)" in text
    assert "Problems: NO_TAG from mv; 1 malformed or invalid call(s); it hit the step limit." in text
    assert "Expected outcome: Nothing to do." in text
    assert max(len(line) for line in text.splitlines() if line.startswith("  1.")) < 120  # clipped


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_the_memory_note_does_not_shrink_the_committed_budget(tokenizer, tasks, mode) -> None:
    """A limit that lets the plain committed episode finish lets it finish after a note of N = 2 too,
    and every imagined attempt gets that same budget (bfcl_cpu's evaluation appended the note inside
    the 1,400-token training limit, so the committed attempt ran out of context before it acted)."""
    task = tasks[0].first_turns(1)
    loose = RolloutLimits(max_steps_per_turn=3, max_new_tokens=48)
    plain = _rollout(Scripted(tokenizer), tokenizer, "none", 0, loose).run([task])[0]
    limits = RolloutLimits(max_steps_per_turn=3, max_new_tokens=48, max_episode_tokens=len(plain.ids) + 48)
    plain = _rollout(Scripted(tokenizer), tokenizer, "none", 0, limits).run([task])[0]
    assert "max_episode_tokens" not in plain.flags and plain.calls
    ep = _rollout(Scripted(tokenizer), tokenizer, mode, 2, limits).run([task])[0]
    assert ep.note_tokens == token_counts(ep).memory > 48  # the note is there, and longer than the slack
    assert "max_episode_tokens" not in ep.flags and len(ep.calls) == len(plain.calls)
    assert ep.budget_used == len(plain.ids)  # the committed episode spent exactly what it spent alone
    attempts = [a for r in ep.imagined for a in r.attempts]
    assert len(attempts) == 2 and all("max_episode_tokens" not in a.flags and a.calls for a in attempts)
