"""BFCL memory categories: bfcl-eval's two phases (prerequisite conversations that write memory
snapshots, then the questions from the final snapshot) and its ``agentic_checker``; the oracle
scores 100 % only if the snapshots chain, noop what the checker predicts for its text."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace._bfcl import bfcl_module
from envace.evaluation import TaskFilter, evaluate
from envace.evaluation.bfcl import TrustedEnvironment, overall
from envace.evaluation.bfcl_memory import (
    MEMORY_CATEGORIES,
    load_questions,
    memory_phase,
    oracle_text,
    prerequisites,
    score_memory,
)
from envace.evaluation.policies import TextEngine
from envace.protocol.render import HermesFormat
from envace.protocol.tokens import PieceEncoder
from envace.rollout import Rollout, RolloutLimits
from envace.rollout.reference import NOOP


def _rollout(tokenizer) -> Rollout:
    engine = TextEngine(tokenizer, [tokenizer.eos_token_id], text=oracle_text)
    limits = RolloutLimits(max_steps_per_turn=20, max_calls_per_step=64, max_new_tokens=4096, max_episode_tokens=10**6)
    fmt = HermesFormat(tool_style="compact")
    return Rollout(engine, fmt, PieceEncoder(tokenizer), TrustedEnvironment(), limits, validate_calls=False)


def test_oracle_and_noop_on_memory() -> None:
    tasks = TaskFilter(categories=list(MEMORY_CATEGORIES))
    oracle = evaluate("bfcl", "oracle", tasks=tasks, out=None, quiet=True)
    assert len(oracle.items) == 2 * 155 and all(it.success for it in oracle.items)
    rows = {r.category: r.value for r in oracle.rows}
    # memory = mean(kv, vector, rec_sum) with vector missing (0); agentic = mean(web search 0, memory)
    assert rows["[agentic]"] == pytest.approx(1 / 3, abs=1e-6)  # rows hold 6 digits
    assert rows["[overall_partial]"] == pytest.approx(0.4 / 3, abs=1e-6)
    assert rows["[overall_evaluated]"] == 1.0
    noop = evaluate("bfcl", "noop", tasks=tasks, out=None, quiet=True)
    checker = bfcl_module("eval_checker.agentic_eval.agentic_checker").agentic_checker
    truth = {t.id: t.extra["ground_truth"] for t in load_questions(list(MEMORY_CATEGORIES))}
    predicted = {i: checker(NOOP, gt)["valid"] for i, gt in truth.items()}
    assert {it.task_id: it.success for it in noop.items} == predicted
    assert not any(predicted.values())  # no possible answer occurs in "I cannot help with that."
    assert {it.details["error_type"] for it in noop.items} == {"agentic:answer_not_found"}


def test_questions_start_from_the_chained_snapshots(tokenizer) -> None:
    questions = [q for q in load_questions(["memory_rec_sum"]) if q.extra["scenario"] == "healthcare"]
    chain = prerequisites("memory_rec_sum", "healthcare", questions)
    assert len(chain) == 5 and all(t.user_turns for t in chain)
    # the oracle writes an answer where the user says it: spread over the chain, not all at the end
    writes = [sum(len(turn) for turn in t.gold) for t in chain]
    assert sum(writes) == 25 and writes[0] > 0
    rollout, prompts = _rollout(tokenizer), []

    def run(tasks):
        prompts.append([t.system_prompt for t in tasks])
        return rollout.run(tasks)

    with memory_phase("memory_rec_sum", questions, run) as ready:
        # conversation k sees what conversations before it wrote (bfcl-eval's system prompt)
        assert "no content in the memory" in prompts[0][0]
        first = chain[0].gold[next(i for i, turn in enumerate(chain[0].gold) if turn)][0].arguments["text"]
        assert all(first in p[0] for p in prompts[1:])
        assert all(q.extra["memory_key"] + ": " in ready[0].system_prompt for q in questions)
        assert "{'answer':" in ready[0].system_prompt  # the agentic answer format
        episodes = rollout.run(ready)
    assert [score_memory(ep).success for ep in episodes] == [True] * 25
    assert all(ep.calls[0].call.name == "memory_retrieve" for ep in episodes)
    # without the prerequisites the memory is empty: the oracle reads nothing and fails
    with memory_phase("memory_rec_sum", questions, lambda tasks: []) as bare:
        episodes = rollout.run(bare)
    assert episodes[0].calls[0].response == {"error": "Memory is empty."}
    assert not any(score_memory(ep).success for ep in episodes)


def test_kv_snapshot_files_and_folder_are_per_run(tokenizer) -> None:
    questions = [q for q in load_questions(["memory_kv"]) if q.extra["scenario"] == "notetaker"][:2]
    rollout = _rollout(tokenizer)
    with memory_phase("memory_kv", questions, rollout.run) as ready:
        folder = ready[0].env["initial_config"]["MemoryAPI_kv"]["model_result_dir"]
        episodes = rollout.run(ready)
        with memory_phase("memory_kv", questions, lambda tasks: []) as other:
            assert other[0].env["initial_config"]["MemoryAPI_kv"]["model_result_dir"] != folder
    assert [score_memory(ep).success for ep in episodes] == [True, True]
    assert episodes[0].calls[0].call.name == "archival_memory_retrieve"
    assert not Path(folder).exists()  # removed on exit


def test_final_answer_is_the_last_message_without_calls(tokenizer) -> None:
    task = load_questions(["memory_kv"])[0]  # "What is my first name?" -> Michael
    fmt = HermesFormat(tool_style="compact")

    def run(text):
        engine = TextEngine(tokenizer, [tokenizer.eos_token_id], text=text)
        roll = Rollout(engine, fmt, PieceEncoder(tokenizer), TrustedEnvironment(), RolloutLimits(max_steps_per_turn=2))
        with memory_phase("memory_kv", [task], lambda tasks: []) as ready:
            return roll.run(ready)[0]

    ok = run(lambda ep: "{'answer': 'Michael', 'context': 'you said so'}")
    assert score_memory(ok).success
    always_calls = run(lambda ep: '<tool_call>{"name": "core_memory_list_keys", "arguments": {}}</tool_call>')
    out = score_memory(always_calls)
    assert not out.success and out.details["error_type"] == "agentic:no_last_message"
    assert "max_steps" in always_calls.flags


def test_overall_counts_memory_as_bfcl_does() -> None:
    scores = {"memory_kv": (0.5, 155), "memory_rec_sum": (1.0, 155)}
    # memory = (0.5 + 0 + 1) / 3 (vector missing); agentic = (0 + memory) / 2 (web search missing)
    assert overall(scores)["agentic"] == pytest.approx(0.25)
    assert overall(scores)["overall"] == pytest.approx(0.4 * 0.25)
    assert overall(scores, evaluated_only=True) == pytest.approx({"agentic": 0.75, "overall": 0.75})


def test_memory_key_search_ranks_with_bm25() -> None:
    kv = bfcl_module("eval_checker.multi_turn_eval.func_source_code.memory_kv").MemoryAPI_kv()
    kv.core_memory = {"user_first_name": "Michael", "favourite_drink": "latte"}
    ranked = kv.core_memory_key_search("first name")["ranked_results"]
    assert [key for _, key in ranked] == ["user_first_name", "favourite_drink"]


def test_a_model_runs_the_memory_pipeline() -> None:
    # the random tiny model: 5 notetaker prerequisite conversations, then one question, calls validated
    limits = RolloutLimits(max_steps_per_turn=1, max_new_tokens=8, max_episode_tokens=100_000)
    tasks = TaskFilter(categories=["memory_rec_sum"], task_ids=["memory_rec_sum_130-notetaker-0"])
    result = evaluate("bfcl", "tiny", tasks=tasks, limits=limits, out=None, quiet=True)
    (item,) = result.items
    assert item.category == "memory_rec_sum" and item.score == 0.0
    assert item.details["error_type"] in {"agentic:no_last_message", "agentic:answer_not_found"}
