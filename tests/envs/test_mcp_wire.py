"""What a server writes that is not the protocol, and a server that dies at start, are each one clear
answer at once: invalid UTF-8 is ``SERVER_GARBAGE`` quoting what was written (not a ``TIMEOUT`` at the
deadline), and a server that exits at start-up is one line with its stderr's last lines."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace.envs.mcp import MCPEnvironment, list_server_tools
from envace.envs.mcp_spec import ServerSpec
from envace.types import ToolCall

SERVER = str(Path(__file__).parent / "servers" / "misbehaving.py")
TOOLS = [{"name": "bump", "description": "Add.", "parameters": {"type": "object", "properties": {}}}]


def stdio(mode: str, **deadlines: float) -> ServerSpec:
    return ServerSpec.parse({"command": sys.executable, "args": [SERVER, mode], **deadlines})


@pytest.mark.parametrize(("mode", "quoted"), [("bad_utf8", "not utf-8"), ("garbage", "this is not json-rpc")])
def test_bytes_that_are_not_the_protocol_fail_at_once_quoting_them(mode: str, quoted: str) -> None:
    env = MCPEnvironment(stdio(mode, call_timeout_s=30.0), TOOLS)
    began = time.monotonic()
    try:
        error = env.execute(ToolCall("bump", {}))["error"]
    finally:
        env.close()
    assert error["code"] == "SERVER_GARBAGE", error
    assert quoted in error["message"] and len(error["message"]) < 400, error
    assert time.monotonic() - began < 15  # not the 30 s deadline


def test_a_server_that_dies_at_start_is_one_line_with_its_stderr() -> None:
    began = time.monotonic()
    with pytest.raises(ValueError) as failed:
        list_server_tools(stdio("die_at_start"))
    text = str(failed.value)
    assert "\n" not in text and "RuntimeError: no database" in text and "opening loans.sqlite" in text, text
    assert time.monotonic() - began < 15  # not the 20 s connect deadline


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_an_http_server_that_dies_under_a_call_is_crashed_not_a_server_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "crash_later", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not listening(port):
            time.sleep(0.1)
        spec = ServerSpec.parse({"url": f"http://127.0.0.1:{port}/mcp", "call_timeout_s": 5.0})
        env = MCPEnvironment(spec, TOOLS)
        answers = [env.execute(ToolCall("bump", {})) for _ in range(5)]  # the server exits on its fifth call
        env.close()
    finally:
        proc.kill()
        proc.wait(10)
    assert answers[:4] == [{"counter": n} for n in (1, 2, 3, 4)]
    assert answers[4]["error"]["code"] == "SERVER_CRASHED", answers[4]  # was SERVER_ERROR: trained on as an answer
