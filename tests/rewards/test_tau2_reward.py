"""The environment-free tau2 reward on every tau2 task: gold pays, doing nothing does not (where gold acts),
perturbed gold calls pay less, and it agrees with tau2's official evaluator on real replays."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from envace.data.sources.tau2 import gold_messages, load_tau2, official_reward
from envace.envs.tau2 import Tau2Environment
from envace.rewards.tau2 import tau2_reward
from envace.types import CallRecord, Message, Task, ToolCall, Trajectory


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return load_tau2(split="all")


def gold_episode(task: Task) -> Trajectory:
    """Every gold action as a successful call, and one closing message with the information to communicate."""
    calls = [CallRecord(ToolCall(a["name"], dict(a["arguments"])), {"ok": True}) for a in task.extra["actions"]]
    text = "; ".join(task.extra["communicate_info"]) or "Done."
    return Trajectory(task, [Message("assistant", text, [r.call for r in calls]), Message("assistant", text)], calls)


def test_gold_pays_and_empty_pays_only_refusals(tasks: list[Task]) -> None:
    assert all(tau2_reward(t, gold_episode(t)).score == 1.0 for t in tasks)
    empty = {t.id: tau2_reward(t, Trajectory(t, [])) for t in tasks}
    paid = sorted(k for k, r in empty.items() if r.score)
    refusals = sorted(t.id for t in tasks if not t.extra["actions"] and not t.extra["communicate_info"])
    assert paid == refusals
    # refusals with nothing to communicate; retail_24 has no actions but must tell the user something
    assert paid == sorted(
        ["airline_0", "airline_10", "airline_26", "airline_28", "airline_31", "airline_34", "airline_46", "retail_57"]
    )


def test_single_argument_changes_lower_the_score(tasks: list[Task]) -> None:
    checked = 0
    for task in tasks[::7]:
        episode = gold_episode(task)
        names = Counter((a["name"], str(a["arguments"])) for a in task.extra["actions"])
        for i, (record, action) in enumerate(zip(episode.calls, task.extra["actions"], strict=True)):
            keys = sorted(record.call.arguments) if action["compare_args"] is None else action["compare_args"]
            if not keys or names[(record.call.name, str(record.call.arguments))] > 1:
                continue  # tau2 compares no argument here (compare_args == []), or a twin action still matches
            key = keys[0]
            changed = copy.deepcopy(episode)
            changed.calls[i] = CallRecord(ToolCall(record.call.name, {**record.call.arguments, key: "WRONG"}), {})
            out = tau2_reward(task, changed)
            assert out.score < 1.0 and not out.success, (task.id, record.call.name, key)
            checked += 1
    assert checked > 50


def test_missing_communication_and_stray_writes(tasks: list[Task]) -> None:
    task = next(t for t in tasks if t.id == "airline_7")  # two cancellations, a flight change, "1628"
    episode = gold_episode(task)
    silent = Trajectory(task, [], episode.calls)
    out = tau2_reward(task, silent)
    assert out.details["communicate"] == [{"info": "1628", "met": False}] and 0 < out.score < 1
    extra = CallRecord(ToolCall("send_certificate", {"user_id": "x", "amount": 100}), {"ok": True})
    assert tau2_reward(task, Trajectory(task, episode.messages, [*episode.calls, extra])).score == 0.0
    # the response excuses nothing: a stray write that "failed" (a rehearsed error) is stray all the same
    failed = CallRecord(extra.call, {"error": {"code": "EXECUTION_ERROR", "message": "no user"}})
    out = tau2_reward(task, Trajectory(task, episode.messages, [*episode.calls, failed]))
    assert out.score == 0.0 and out.details["stray_writes"] == ["send_certificate"]


def test_omitted_arguments_do_not_match(tasks: list[Task]) -> None:
    # tau2's compare_with_tool_call compares the call's own arguments, so `{}` would match any action;
    # without a DB check that would pay every gold action called with no arguments
    task = next(t for t in tasks if t.id == "retail_0")
    bare = [CallRecord(ToolCall(a["name"], {}), {"ok": True}) for a in task.extra["actions"]]
    out = tau2_reward(task, Trajectory(task, gold_episode(task).messages, bare))
    assert out.score == 0.0 and out.details["stray_writes"] == ["exchange_delivered_order_items"]
    assert not any(a["matched"] for a in out.details["actions"])


def test_telecom_user_side_actions(tasks: list[Task]) -> None:
    task = next(
        t
        for t in tasks
        if t.category == "telecom" and {a["requestor"] for a in t.extra["actions"]} == {"assistant", "user"}
    )
    agent_only = [r for r in gold_episode(task).calls if r.call.name not in task.extra["user_tools"]]
    episode = Trajectory(task, [], agent_only)
    assert tau2_reward(task, episode).score < 1.0
    assert tau2_reward(task, episode, requestors=("assistant",)).score == 1.0


@pytest.mark.parametrize("task_id", ["airline_7", "retail_1", "retail_5"])
def test_agrees_with_the_official_evaluator_on_real_replays(tasks: list[Task], task_id: str) -> None:
    task = next(t for t in tasks if t.id == task_id)
    env = Tau2Environment.from_task(task)
    calls = [CallRecord(c, env.execute(c)) for c in task.gold[0]]
    text = "; ".join(task.extra["communicate_info"]) or "Done."
    assert tau2_reward(task, Trajectory(task, [Message("assistant", text)], calls)).score == 1.0
    assert official_reward(task, gold_messages(task)).reward == 1.0
