"""The MCP environment against real MCP servers the tests start (stdio, and HTTP on 127.0.0.1).

Each misbehaving server (tests/envs/servers/misbehaving.py) must give a structured error within its
deadline; two episodes never see each other's state; live servers are bounded.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace.envs import make_environment
from envace.envs.mcp import MCPEnvironment, list_server_tools
from envace.envs.mcp_bridge import Bridge, MCPFailure
from envace.envs.mcp_spec import ServerSpec
from envace.types import Task, ToolCall

SERVER = str(Path(__file__).parent / "servers" / "misbehaving.py")
OBJECT = "object"
TOOLS = [
    {"name": "bump", "description": "Add.", "parameters": {"type": OBJECT, "properties": {"by": {"type": "integer"}}}},
    {"name": "fail", "description": "Raise.",
     "parameters": {"type": OBJECT, "properties": {"reason": {"type": "string"}}, "required": ["reason"]}},
]  # fmt: skip


def stdio(mode: str, **deadlines: float) -> ServerSpec:
    return ServerSpec.parse({"command": sys.executable, "args": [SERVER, mode], **deadlines})


def env_of(spec: ServerSpec) -> MCPEnvironment:
    return MCPEnvironment(spec, TOOLS)


@pytest.fixture(scope="module")
def http_url():
    """The good server over streamable HTTP on 127.0.0.1 (a free port), for the module's tests."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "good", str(port)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def test_stdio_lists_and_calls_and_episodes_are_isolated():
    tools = list_server_tools(stdio("good"))
    assert {t["name"] for t in tools} == {"bump", "fail"}
    bump = next(t for t in tools if t["name"] == "bump")
    assert bump["parameters"]["properties"]["by"]["type"] == "integer" and "counter" not in str(bump["parameters"])
    task = Task("t", "mine", tools=tools, user_turns=["go"], env={"kind": "mcp", "server": stdio("good").to_json()})
    first, second = make_environment(task), make_environment(task)
    assert isinstance(first, MCPEnvironment)
    try:
        assert first.execute(ToolCall("bump", {"by": 2})) == {"counter": 2}
        assert first.execute(ToolCall("bump", {"by": 3})) == {"counter": 5}
        assert second.execute(ToolCall("bump", {"by": 1})) == {"counter": 1}  # its own server: no state of the first
        error = first.execute(ToolCall("fail", {"reason": "boom"}))
        assert error["error"]["code"] == "TOOL_ERROR"  # isError: a structured observation, the session goes on
        assert first.execute(ToolCall("bump", {})) == {"counter": 6}
    finally:
        first.close()
        second.close()


def test_http_sessions_are_isolated(http_url):
    spec = ServerSpec.parse({"url": http_url})
    assert {t["name"] for t in list_server_tools(spec)} == {"bump", "fail"}
    a, b = env_of(spec), env_of(spec)
    try:
        assert a.execute(ToolCall("bump", {"by": 4})) == {"counter": 4}
        assert b.execute(ToolCall("bump", {"by": 1})) == {"counter": 1}
        assert a.execute(ToolCall("bump", {"by": 1})) == {"counter": 5}
    finally:
        a.close()
        b.close()


def test_arguments_are_validated_before_anything_is_sent():
    env = env_of(stdio("crash"))
    assert env.execute(ToolCall("bump", {"by": "x"}))["error"]["code"] == "INVALID_ARGUMENTS"
    assert env.execute(ToolCall("rm", {}))["error"]["code"] == "UNKNOWN_TOOL"
    assert env.execute(ToolCall("bump", {"by": 10**5000}))["error"]["code"] == "INVALID_ARGUMENTS"
    assert env.session._task is None  # no server was started for them
    env.close()


@pytest.mark.parametrize(
    ("mode", "code", "within_s"),
    [
        ("crash", "SERVER_CRASHED", 8.0),
        ("hang", "TIMEOUT", 8.0),
        ("slow", "TIMEOUT", 8.0),
        ("garbage", "SERVER_GARBAGE", 8.0),
    ],
)
def test_misbehaving_servers_give_structured_errors_within_their_deadlines(mode, code, within_s):
    env = env_of(stdio(mode, call_timeout_s=1.0, connect_timeout_s=6.0))
    began = time.monotonic()
    first = env.execute(ToolCall("bump", {"by": 1}))
    took = time.monotonic() - began
    assert first["error"]["code"] == code, first
    assert took < within_s  # start-up (about 1 s) + the 1 s call deadline, never the server's hour
    assert env.broken and env.execute(ToolCall("bump", {}))["error"]["code"] == "ENVIRONMENT_BROKEN"
    env.close()


def test_garbage_fails_the_call_before_its_deadline():
    env = env_of(stdio("garbage", call_timeout_s=30.0))
    began = time.monotonic()
    assert env.execute(ToolCall("bump", {}))["error"]["code"] == "SERVER_GARBAGE"
    assert time.monotonic() - began < 15  # not the 30 s deadline
    env.close()


def test_a_server_that_never_starts_is_unavailable_within_the_connect_deadline():
    env = env_of(stdio("slow_start", connect_timeout_s=2.0))
    began = time.monotonic()
    assert env.execute(ToolCall("bump", {}))["error"]["code"] == "SERVER_UNAVAILABLE"
    assert time.monotonic() - began < 5
    env.close()
    with pytest.raises(ValueError, match="tools/list failed: SERVER_UNAVAILABLE"):
        list_server_tools(stdio("slow_start", connect_timeout_s=1.0))


def test_live_servers_are_bounded():
    # 6 s to start: a 1.5 s budget failed the first server's start-up on two cores under load (CI, 2026-12-08)
    spec = stdio("good", connect_timeout_s=6.0, max_live=1)
    a, b = env_of(spec), env_of(spec)
    assert a.execute(ToolCall("bump", {})) == {"counter": 1}
    busy = b.execute(ToolCall("bump", {}))["error"]
    assert busy["code"] == "SERVER_UNAVAILABLE" and "(max_live)" in busy["message"], busy  # the one slot stayed busy
    closing = a.session.close()
    assert closing is not None
    closing.result(10)  # the first server stopped: its slot is free
    c = env_of(spec)
    assert c.execute(ToolCall("bump", {})) == {"counter": 1}
    c.close()
    b.close()


def test_bridge_run_is_bounded_and_cancels():
    import asyncio

    bridge, cancelled = Bridge(), []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def answer() -> int:
        return 42

    assert bridge.run(answer(), 5, "answer") == 42
    with pytest.raises(MCPFailure, match="no answer within 0.2 s") as info:
        bridge.run(forever(), 0.2, "forever")
    assert info.value.code == "TIMEOUT"
    time.sleep(0.2)
    assert cancelled == [True]


def test_spec_errors_are_one_line():
    for bad, match in [({}, "exactly one of"), ({"url": "ftp://x"}, "not an http"),
                       ({"command": "x", "args": "y"}, "args"),
                       ({"command": "x", "call_timeout_s": -1}, "call_timeout_s")]:  # fmt: skip
        with pytest.raises(ValueError, match=match) as info:
            ServerSpec.parse(bad)
        assert "\n" not in str(info.value)
