"""The boundary every environment call crosses: a deadline, argument checks, JSON-safe answers."""

from __future__ import annotations

import json
import threading
import time

import pytest

from envace.data.sources.bfcl import load_multi_turn
from envace.envs.base import ENVIRONMENT_BROKEN, TIMEOUT, call_with_deadline, json_safe, make_environment
from envace.envs.bfcl import BFCLEnvironment
from envace.envs.tau2 import Tau2Environment
from envace.types import ToolCall, is_error

DEADLINE = 0.3
MARGIN = 0.5  # thread start and join on a busy machine


@pytest.fixture(scope="module")
def math_task():
    return next(t for t in load_multi_turn() if t.id == "multi_turn_base_15")  # GorillaFileSystem + MathAPI


@pytest.fixture
def release():
    """Set at the end of a test: busy-looping tools stop and leave the CPU alone."""
    event = threading.Event()
    yield event
    event.set()


def code(response) -> str:
    assert is_error(response), response
    return response["error"]["code"]


def observable(response) -> bool:
    """What every observation must be: strict JSON that encodes as UTF-8."""
    json.dumps(response, allow_nan=False).encode("utf-8")
    return True


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def test_call_with_deadline_returns_raises_or_times_out() -> None:
    assert call_with_deadline(lambda: 3, 1.0) == 3
    with pytest.raises(ZeroDivisionError):
        call_with_deadline(lambda: 1 / 0, 1.0)


@pytest.mark.parametrize("hang", ["sleep", "loop"])
def test_a_hanging_bfcl_tool_is_a_timeout_then_the_environment_is_broken(math_task, monkeypatch, release, hang):
    env = BFCLEnvironment.from_task(math_task, call_timeout_s=DEADLINE)
    assert env.execute(ToolCall("pwd", {})) == {"current_working_directory": "/project"}

    def stuck(**kwargs):
        if hang == "sleep":
            release.wait(10)
        while not release.is_set():  # a Python loop: it gives up the GIL, so the deadline holds
            pass

    monkeypatch.setattr(env.instances()["GorillaFileSystem"], "ls", stuck)
    response, took = timed(lambda: env.execute(ToolCall("ls", {})))
    assert code(response) == TIMEOUT and took < DEADLINE + MARGIN, (response, took)
    assert env.broken
    assert code(env.execute(ToolCall("pwd", {}))) == ENVIRONMENT_BROKEN  # the state is unknown now


def test_a_hanging_tau2_call_is_a_timeout_and_stays_out_of_the_history(monkeypatch, release) -> None:
    env = Tau2Environment("airline", call_timeout_s=DEADLINE)
    env.execute(ToolCall("get_user_details", {"user_id": "raj_sanchez_7340"}))
    monkeypatch.setattr(env.tau2, "get_response", lambda call: release.wait(10))
    response, took = timed(lambda: env.execute(ToolCall("get_user_details", {"user_id": "raj_sanchez_7340"})))
    assert code(response) == TIMEOUT and took < DEADLINE + MARGIN, (response, took)
    assert len(env.history()) == 1
    assert code(env.execute_user(ToolCall("anything", {}))) == ENVIRONMENT_BROKEN
    assert len(env.history()) == 1


def test_the_deadline_is_configured_on_the_environment(math_task) -> None:
    assert make_environment(math_task).call_timeout_s == 5.0
    assert make_environment(math_task, call_timeout_s=1.5).call_timeout_s == 1.5
    with pytest.raises(ValueError, match="positive"):
        BFCLEnvironment.from_task(math_task, call_timeout_s=0)


@pytest.mark.parametrize("value", [float("nan"), float("-inf"), "\ud800", "ok\udfffok", {"\udc80": 1}, 10**4000])
def test_unusable_arguments_never_reach_the_tool(math_task, monkeypatch, value) -> None:
    env = BFCLEnvironment.from_task(math_task)
    seen = []
    monkeypatch.setattr(env.instances()["GorillaFileSystem"], "mkdir", lambda **kw: seen.append(kw))
    for validate in (True, False):  # trusted replay skips the schema, never the boundary
        response = env.execute(ToolCall("mkdir", {"dir_name": value}), validate=validate)
        assert code(response) == "INVALID_ARGUMENTS" and not seen and observable(response)
    assert not is_error(env.execute(ToolCall("mkdir", {"dir_name": [1.5, "\u00e9"]}), validate=False)) and seen


def test_deep_nesting_is_refused_before_the_tool(math_task) -> None:
    deep: list = []
    for _ in range(100):
        deep = [deep]
    env = BFCLEnvironment.from_task(math_task)
    response = env.execute(ToolCall("mean", {"numbers": deep}), validate=False)
    assert code(response) == "INVALID_ARGUMENTS" and "nested deeper" in response["error"]["message"]
    tau2 = Tau2Environment("retail")
    assert code(tau2.execute(ToolCall("calculate", {"expression": "\ud800"}))) == "INVALID_ARGUMENTS"
    assert tau2.history() == []


def test_what_a_tool_returns_or_echoes_becomes_json_safe(math_task, monkeypatch) -> None:
    env = BFCLEnvironment.from_task(math_task)
    fs = env.instances()["GorillaFileSystem"]
    monkeypatch.setattr(fs, "pwd", lambda: {"x": float("nan"), "s": "a\ud800b", "big": 10**5000})
    assert env.execute(ToolCall("pwd", {})) == {"x": "nan", "s": "a\ufffdb", "big": "<integer of 16610 bits>"}

    def echo_error(**kwargs):
        raise ValueError("no folder named '\udc80'")

    monkeypatch.setattr(fs, "cd", echo_error)
    response = env.execute(ToolCall("cd", {"folder": "x"}))
    assert code(response) == "EXECUTION_ERROR" and "\ufffd" in response["error"]["message"] and observable(response)


def test_a_tau2_answer_with_nan_or_a_surrogate_becomes_json_safe(monkeypatch) -> None:
    from tau2.data_model.message import ToolMessage

    env = Tau2Environment("retail")
    body = '{"a": NaN, "b": "\\ud800", "c": [Infinity]}'
    monkeypatch.setattr(env.tau2, "get_response", lambda c: ToolMessage(id=c.id, content=body, role="tool"))
    response = env.execute(ToolCall("calculate", {"expression": "1"}))
    assert response == {"a": "nan", "b": "\ufffd", "c": ["inf"]} and observable(response)


def test_json_safe_caps_depth_and_keeps_plain_json() -> None:
    plain = {"a": [1, 2.5, True, None, "x", {"b": []}]}
    assert json_safe(plain) == plain
    deep: list = []
    for _ in range(300):
        deep = [deep]
    assert observable(json_safe(deep))


@pytest.mark.parametrize(
    ("name", "arguments"),
    [("power", {"base": 9, "exponent": 10**9}), ("power", {"base": 10**100, "exponent": 10**4}),
     ("logarithm", {"value": 2.0, "base": 10.0, "precision": 10**9}),
     ("square_root", {"number": 2.0, "precision": 10**9}),
     ("round_number", {"number": 5, "decimal_places": -(10**9)})],
)  # fmt: skip
def test_math_calls_that_would_hold_the_gil_are_refused_at_once(math_task, name, arguments) -> None:
    env = BFCLEnvironment.from_task(math_task)
    response, took = timed(lambda: env.execute(ToolCall(name, arguments)))
    assert code(response) == "INVALID_ARGUMENTS" and took < 0.5, (response, took)


def test_math_calls_within_the_bounds_still_run(math_task) -> None:
    env = BFCLEnvironment.from_task(math_task)
    assert env.execute(ToolCall("power", {"base": 2, "exponent": 10})) == {"result": 1024}
    assert env.execute(ToolCall("power", {"base": 2.0, "exponent": 0.5}))["result"] == pytest.approx(2**0.5)
    assert env.execute(ToolCall("round_number", {"number": 1234, "decimal_places": -2})) == {"result": 1200}
    assert env.execute(ToolCall("square_root", {"number": 2.0, "precision": 5})) == {"result": "1.4142"}
