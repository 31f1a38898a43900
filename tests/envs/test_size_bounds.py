"""Declared size bounds on a tool's arguments and responses, for Python tools and MCP servers alike:
oversize is a structured error (``INVALID_ARGUMENTS``, ``RESPONSE_TOO_LARGE``) and the episode goes on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from envace.envs import make_environment
from envace.envs.base import SizeBounds
from envace.types import Task, ToolCall

SERVER = str(Path(__file__).parent / "servers" / "misbehaving.py")
OWN = Path(__file__).parents[1]  # tests/: holds own_tools, a user's package
INTEGER, STRING = {"type": "integer"}, {"type": "string"}
TOOLS = [
    {"name": "bump", "description": "Add.", "parameters": {"type": "object", "properties": {"by": INTEGER}}},
    {"name": "fail", "description": "Raise.", "parameters": {"type": "object", "properties": {"reason": STRING}}},
]


@pytest.fixture(autouse=True)
def _own_tools_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(OWN))


def python_task(**bounds: int) -> Task:
    env = {"kind": "python", "module": "own_tools.notes_tools", **bounds}
    return Task("t", "tasks", tools=[], user_turns=["go"], env=env)


def test_python_tools_are_bounded_both_ways_and_the_episode_goes_on() -> None:
    env = make_environment(python_task(max_argument_bytes=1000, max_response_bytes=1000))
    assert env is not None
    too_large = env.execute(ToolCall("shout", {"text": "abc", "times": 1000}))
    assert (
        too_large["error"]["code"] == "RESPONSE_TOO_LARGE" and "over the bound of 1000" in too_large["error"]["message"]
    )
    refused = env.execute(ToolCall("word_count", {"text": "a " * 1000}))
    assert refused["error"]["code"] == "INVALID_ARGUMENTS" and "max_argument_bytes" in refused["error"]["message"]
    assert env.execute(ToolCall("word_count", {"text": "a b c"})) == {"words": 3}
    assert not env.broken


def test_the_defaults_bound_a_ten_megabyte_response() -> None:
    env = make_environment(python_task())
    assert env is not None and env.bounds == SizeBounds()
    assert (
        env.execute(ToolCall("shout", {"text": "x" * 1000, "times": 10_000}))["error"]["code"] == "RESPONSE_TOO_LARGE"
    )


def test_an_mcp_server_is_bounded_both_ways_and_its_session_goes_on() -> None:
    server = {"command": sys.executable, "args": [SERVER, "good"]}
    env_spec = {"kind": "mcp", "server": server, "max_argument_bytes": 100, "max_response_bytes": 13}
    env = make_environment(Task("t", "tasks", tools=TOOLS, user_turns=["go"], env=env_spec))
    assert env is not None
    try:
        assert env.execute(ToolCall("fail", {"reason": "x" * 200}))["error"]["code"] == "INVALID_ARGUMENTS"
        assert env.session._task is None  # refused before a server was started
        assert env.execute(ToolCall("bump", {"by": 12}))["error"]["code"] == "RESPONSE_TOO_LARGE"  # {"counter":12}: 14
        assert env.execute(ToolCall("bump", {"by": -10})) == {"counter": 2}  # the same session, its state kept
    finally:
        env.close()


@pytest.mark.parametrize("bad", [0, -5, "big", True])
def test_a_bound_that_is_not_a_positive_integer_is_one_line(bad) -> None:
    with pytest.raises(ValueError, match=r"^task t: env.max_response_bytes must be a positive integer"):
        make_environment(python_task(max_response_bytes=bad))
