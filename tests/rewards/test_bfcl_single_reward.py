"""The single-turn training reward is bfcl-eval's ast_checker on the episode's first act step: on training
episodes rolled out as configs/bfcl_single.yaml rolls them out (one act step, the real_env responder), the
reward equals the checker's verdict on the calls written, called here directly on the wheel's records."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from typing import Any

from envace._bfcl import bfcl_data_dir, bfcl_module
from envace.data.sources import load_source
from envace.protocol.render import HermesFormat
from envace.protocol.tokens import PieceEncoder
from envace.rewards import compute_reward, reward_name
from envace.rollout import RealEnvironment, Rollout, RolloutLimits
from envace.rollout.reference import ScriptedEngine
from envace.types import ToolCall

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple"]


@cache
def raw_docs(category: str) -> dict[str, list[dict[str, Any]]]:
    """``id -> function docs`` read straight from the wheel's file, as bfcl-eval's runner reads them."""
    with (bfcl_data_dir() / f"BFCL_v4_{category}.json").open(encoding="utf-8") as fh:
        return {r["id"]: r["function"] for r in map(json.loads, filter(str.strip, fh))}


def checker_verdict(category: str, task_id: str, answer: list[Any], calls: list[ToolCall]) -> bool:
    checker = bfcl_module("eval_checker.ast_eval.ast_checker")
    python = bfcl_module("constants.enums").Language.PYTHON
    model_output = [{c.name: dict(c.arguments)} for c in calls]
    return bool(checker.ast_checker(raw_docs(category)[task_id], model_output, answer, python, category, "x")["valid"])


def variants(gold: list[ToolCall]) -> list[list[ToolCall]]:
    """The accepted calls, and calls the checker should reject: a value changed, an argument dropped, a
    function renamed, a call repeated, no call, the calls reversed (parallel: still accepted)."""
    first = gold[0]
    key = next(iter(first.arguments), None)
    out = [gold, [ToolCall(first.name + "_v2", first.arguments), *gold[1:]], [*gold, gold[0]], [], gold[::-1]]
    if key is not None:
        value = first.arguments[key]
        changed = (not value) if isinstance(value, bool) else value + 1 if isinstance(value, int | float) else "zz"
        out.append([ToolCall(first.name, {**first.arguments, key: changed}), *gold[1:]])
        out.append([ToolCall(first.name, {k: v for k, v in first.arguments.items() if k != key}), *gold[1:]])
    return out


class Writes(ScriptedEngine):
    """Each episode writes the calls its task copy names (``extra["calls"]``) in one act step."""

    def text_for(self, episode: Any) -> str:
        return _text(episode.task.extra["calls"])


def _text(calls: list[ToolCall]) -> str:
    body = "".join(f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>" for c in calls)
    return body or "I cannot help with that."


def test_the_reward_is_the_official_checker_on_training_episodes(tokenizer: Any) -> None:
    tasks = load_source("bfcl-single-turn", split="train", categories=CATEGORIES)[::25]  # 41 spread over the split
    copies = [replace(t, extra={**t.extra, "calls": calls}) for t in tasks for calls in variants(t.gold[0])]
    fmt = HermesFormat(tool_style="compact")
    limits = RolloutLimits(max_steps_per_turn=1, max_calls_per_step=8, max_new_tokens=512, max_episode_tokens=8192)
    engine = Writes(tokenizer, [tokenizer.eos_token_id])
    rollout = Rollout(engine, fmt, PieceEncoder(tokenizer), RealEnvironment(), limits)
    agree, scores = 0, []
    for ep in rollout.run(copies, 1):
        written = ep.task.extra["calls"]
        assert reward_name(ep.task) == "bfcl-single-turn"
        out = compute_reward(ep.task, ep.trajectory(), ended_by=ep.flags)
        official = checker_verdict(ep.task.category, ep.task.id, ep.task.extra["possible_answer"], written)
        agree += out.success == official
        scores.append(out.score)
        assert out.score == float(official), (ep.task.id, written, out.details)
    assert set(scores) == {0.0, 1.0} and agree == len(scores) > 200  # a GRPO score: 1 accepted, 0 else


def test_calls_after_the_first_act_step_do_not_count(tokenizer: Any) -> None:
    task = next(t for t in load_source("bfcl-single-turn", split="train", categories=["parallel"]))
    gold = task.gold[0]
    first, rest = _text(gold[:1]), _text(gold[1:])

    class TwoSteps(ScriptedEngine):
        def text_for(self, episode: Any) -> str:
            return first if episode.steps_in_turn == 0 else rest

    rollout = Rollout(TwoSteps(tokenizer, [tokenizer.eos_token_id]), HermesFormat(tool_style="compact"),
                      PieceEncoder(tokenizer), RealEnvironment(), RolloutLimits(max_steps_per_turn=2))  # fmt: skip
    ep = rollout.run([task], 1)[0]
    assert [c.name for m in ep.messages if m.role == "assistant" for c in m.tool_calls] == [c.name for c in gold]
    assert compute_reward(task, ep.trajectory(), ended_by=ep.flags).score == 0.0
    assert not checker_verdict(task.category, task.id, task.extra["possible_answer"], gold[:1])


def test_a_target_that_breaks_its_schema_is_refused_though_the_checker_accepts_it(tokenizer: Any) -> None:
    """The known disagreement (docs/data.md): the rollout validates calls against the tool's schema, so a
    call the checker accepts but the schema forbids (a list for a string enum) is never paid."""
    task = next(t for t in load_source("bfcl-single-turn", split="train", categories=["live_simple"])
                if t.id == "live_simple_71-35-0")  # fmt: skip
    gold = task.gold[0]
    limits = RolloutLimits(max_steps_per_turn=1, max_new_tokens=512, max_episode_tokens=8192)
    engine = Writes(tokenizer, [tokenizer.eos_token_id])
    copy = replace(task, extra={**task.extra, "calls": gold})
    ep = Rollout(engine, HermesFormat(tool_style="compact"), PieceEncoder(tokenizer), RealEnvironment(), limits).run(
        [copy], 1
    )[0]
    assert ep.format_errors == 1 and compute_reward(task, ep.trajectory(), ended_by=ep.flags).score == 0.0
    assert checker_verdict(task.category, task.id, task.extra["possible_answer"], gold)
