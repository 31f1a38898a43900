"""Grounded trajectories carry the real response of every gold call, in order, as bfcl-eval's classes give it."""

from __future__ import annotations

import json
import uuid

import pytest

from envace._bfcl import bfcl_module
from envace.data.grounding import DONE_TEXT, NO_CALL_TEXT, ground
from envace.data.sources.bfcl import MULTI_TURN_CATEGORIES, load_multi_turn
from envace.envs.bfcl import BFCLEnvironment
from envace.types import Task, ToolCall


@pytest.fixture(scope="module")
def tasks():
    by_category = {}
    for task in load_multi_turn():
        by_category.setdefault(task.category, []).append(task)
    return [t for c in MULTI_TURN_CATEGORIES for t in by_category[c][:3]]


def official_responses(task: Task) -> list[str]:
    """The gold executed by bfcl-eval itself (its own call strings, its own instance cache)."""
    utils = bfcl_module("eval_checker.multi_turn_eval.multi_turn_utils")
    name = f"envace_test_{uuid.uuid4().hex}"
    out: list[str] = []
    try:
        for turn in task.extra["ground_truth"]:
            results, _ = utils.execute_multi_turn_func_call(
                turn, task.env["initial_config"], task.env["involved_classes"], name, task.id,
                long_context=task.env["long_context"],
            )  # fmt: skip
            out += results
    finally:
        for key in [k for k in vars(utils) if k.startswith(name)]:
            delattr(utils, key)
    return out


def same_as_bfcl(response, official: str) -> bool:
    """bfcl-eval shows a dict as ``json.dumps`` and anything else as ``str``; we wrap scalars in ``result``."""
    if json.dumps(response) == official:
        return True
    return isinstance(response, dict) and list(response) == ["result"] and str(response["result"]) == official


def test_grounded_responses_are_bfcls_own_in_order(tasks):
    for task in tasks:
        traj = ground(task)
        assert [r.call for r in traj.calls] == [c for turn in task.gold for c in turn]
        official = official_responses(task)
        assert len(official) == len(traj.calls)
        for record, theirs in zip(traj.calls, official, strict=True):
            assert same_as_bfcl(record.response, theirs), (task.id, record.call, record.response, theirs)


def test_message_layout_per_call(tasks):
    task = next(t for t in tasks if t.category == "multi_turn_miss_func")
    traj = ground(task)
    msgs = traj.messages
    assert msgs[0].role == "user" and msgs[0].content == task.user_turns[0]
    users = [i for i, m in enumerate(msgs) if m.role == "user"]
    assert [msgs[i].content for i in users] == task.user_turns
    calls = iter(traj.calls)
    for start, end, gold in zip(users, users[1:] + [len(msgs)], task.gold, strict=True):
        body = msgs[start + 1 : end]
        assert body[-1].role == "assistant" and body[-1].content == (DONE_TEXT if gold else NO_CALL_TEXT)
        steps = body[:-1]
        assert len(steps) == 2 * len(gold)
        for act, tool, call in zip(steps[::2], steps[1::2], gold, strict=True):
            record = next(calls)
            assert act.role == "assistant" and act.tool_calls == [call] and record.call == call
            assert tool.role == "tool" and tool.name == call.name and json.loads(tool.content) == record.response


def test_per_turn_layout_and_a_given_env_stays_open(tasks):
    task = tasks[0]
    env = BFCLEnvironment.from_task(task)
    traj = ground(task, env=env, steps="turn")
    acts = [m for m in traj.messages if m.role == "assistant" and m.tool_calls]
    assert [m.tool_calls for m in acts] == [g for g in task.gold if g]
    assert env.snapshot() != BFCLEnvironment.from_task(task).snapshot()  # the gold changed the given env
    assert ground(task).calls == traj.calls


def test_tasks_without_an_environment_or_with_ragged_gold_are_refused():
    with pytest.raises(ValueError, match="no real environment"):
        ground(Task(id="x", benchmark="b", user_turns=["hi"], gold=[[]]))
    with pytest.raises(ValueError, match="gold turns"):
        ground(Task(id="x", benchmark="b", user_turns=["hi"], gold=[[ToolCall("ls")], []]))
