"""tau2's real environments behind the Environment protocol, and gold verification with tau2's own evaluator."""

from __future__ import annotations

import pytest

from envace.data.grounding import ground
from envace.data.sources.tau2 import load_tau2, verify_tau2
from envace.envs.base import make_environment
from envace.envs.tau2 import Tau2Environment
from envace.protocol.parse import tool_name
from envace.rewards.tau2 import tau2_reward
from envace.types import ToolCall, is_error


@pytest.fixture(scope="module")
def tasks() -> dict[str, object]:
    return {t.id: t for t in load_tau2(split="all")}


def test_from_task_exposes_the_assistant_tools(tasks) -> None:
    task = tasks["airline_0"]
    env = make_environment(task)
    assert isinstance(env, Tau2Environment)
    assert [tool_name(t) for t in env.tools()] == [tool_name(t) for t in task.tools]
    assert env.user_tools() == []


def test_execute_read_write_and_errors(tasks) -> None:
    env = Tau2Environment.from_task(tasks["airline_0"])
    user = env.execute(ToolCall("get_user_details", {"user_id": "raj_sanchez_7340"}))
    assert user["user_id"] == "raj_sanchez_7340" and "reservations" in user
    assert env.execute(ToolCall("get_user_details", {"user_id": "nobody"}))["error"]["code"] == "EXECUTION_ERROR"
    assert env.execute(ToolCall("rm_rf", {}))["error"]["code"] == "UNKNOWN_TOOL"
    assert env.execute(ToolCall("get_user_details", {"user_id": 7}))["error"]["code"] == "INVALID_ARGUMENTS"
    assert env.execute(ToolCall("get_user_details", {}))["error"]["code"] == "INVALID_ARGUMENTS"
    # rejected calls never reach tau2; executed ones (including the failed lookup) are recorded
    assert [c.name for c, _ in env.history()] == ["get_user_details", "get_user_details"]
    # validate=False (trusted gold) skips the schema, never the whitelist
    assert (
        env.execute(ToolCall("get_user_details", {"user_id": 7}), validate=False)["error"]["code"] == "EXECUTION_ERROR"
    )
    assert env.execute(ToolCall("rm_rf", {}), validate=False)["error"]["code"] == "UNKNOWN_TOOL"
    assert len(env.history()) == 3
    before = env.snapshot()
    reservation = user["reservations"][0]
    out = env.execute(ToolCall("cancel_reservation", {"reservation_id": reservation}))
    after = env.snapshot()
    assert not is_error(out) and out["status"] == "cancelled"
    assert before["db_hash"] != after["db_hash"]
    assert after["db"]["reservations"][reservation]["status"] == "cancelled"


def test_plain_text_responses_are_wrapped(tasks) -> None:
    env = Tau2Environment.from_task(tasks["airline_0"])
    out = env.execute(ToolCall("transfer_to_human_agents", {"summary": "help"}))
    assert out == {"result": "Transfer successful"}
    assert env.execute(ToolCall("calculate", {"expression": "2 + 3"})) == {"result": 5.0}


def test_telecom_initial_state_and_user_tools(tasks) -> None:
    task = next(t for t in tasks.values() if t.category == "telecom" and "airplane_mode_on" in t.id)
    env = Tau2Environment.from_task(task)
    names = {tool_name(t) for t in env.user_tools()}
    assert "toggle_airplane_mode" in names and not names & {tool_name(t) for t in env.tools()}
    # the initial actions turned airplane mode on; the agent cannot touch the phone, the user can
    assert env.snapshot()["user_db"]["device"]["airplane_mode"] is True
    assert env.execute(ToolCall("toggle_airplane_mode", {}))["error"]["code"] == "UNKNOWN_TOOL"
    assert not is_error(env.execute_user(ToolCall("toggle_airplane_mode", {})))
    assert env.snapshot()["user_db"]["device"]["airplane_mode"] is False


def test_from_task_rejects_other_kinds(tasks) -> None:
    task = tasks["retail_0"]
    task = type(task).from_json(task.to_json())
    task.env = {"kind": "bfcl"}
    with pytest.raises(ValueError, match="not a tau2 task"):
        Tau2Environment.from_task(task)


@pytest.mark.parametrize("task_id", ["airline_7", "retail_1"])
def test_grounding_replays_gold_with_real_responses(tasks, task_id: str) -> None:
    task = tasks[task_id]
    traj = ground(task)
    assert [r.call for r in traj.calls] == task.gold[0]
    assert not any(is_error(r.response) for r in traj.calls)
    assert traj.messages[0].content == task.user_turns[0]
    # the grounded calls are exactly what the environment-free reward pays (the closing text says
    # nothing, so only a task with nothing to communicate gets the full score)
    out = tau2_reward(task, traj)
    assert all(a["matched"] for a in out.details["actions"]) and out.details["stray_writes"] == []
    assert out.success == (not task.extra["communicate_info"])


def test_grounding_telecom_runs_the_agent_side_only(tasks) -> None:
    task = next(t for t in tasks.values() if t.category == "telecom" and len(t.gold[0]) == 2)
    traj = ground(task)
    assert [r.call.name for r in traj.calls] == [c.name for c in task.gold[0]]
    assert not any(is_error(r.response) for r in traj.calls)


def test_verify_telecom_base_gold_all_pass() -> None:
    report = verify_tau2(domains=("telecom",))
    assert (report.passed, report.total) == (114, 114), report.failures[:3]


def test_verify_gold_and_empty_on_airline_and_retail_samples() -> None:
    # airline_7 and retail_1 write; airline_1 only reads and airline_0 (a refusal) has no actions at
    # all, so tau2 pays the do-nothing episode on those two
    ids = ["airline_0", "airline_1", "airline_7", "retail_1"]
    gold = verify_tau2(domains=("airline", "retail"), task_ids=ids)
    assert (gold.passed, gold.total) == (4, 4), gold.failures
    empty = verify_tau2(domains=("airline", "retail"), task_ids=ids, empty=True)
    assert empty.per_group == {"airline": (2, 3), "retail": (0, 1)}
    assert {f["task_id"] for f in empty.failures} == {"airline_7", "retail_1"}


@pytest.mark.slow
def test_verify_airline_gold_and_empty_counts() -> None:
    assert verify_tau2(domains=("airline",)).per_group == {"airline": (50, 50)}
    assert verify_tau2(domains=("airline",), empty=True).per_group == {"airline": (19, 50)}
