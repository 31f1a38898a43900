"""The LLM judge (the ``openai`` client) against a local OpenAI-compatible stub server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from envace.rewards.judge import LLMJudge, build_prompt, checklist, judge_reward, parse_verdict
from envace.types import Message, Task, ToolCall, Trajectory


class Stub:
    """Scripted replies: each is ``(status, assistant text)``; the last one repeats."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, str]] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []


@pytest.fixture()
def server() -> Iterator[tuple[str, Stub]]:
    stub = Stub()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            stub.requests.append(json.loads(body))
            stub.headers.append({k.lower(): v for k, v in self.headers.items()})
            status, text = stub.replies[min(len(stub.requests), len(stub.replies)) - 1]
            payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", stub
    finally:
        httpd.shutdown()
        httpd.server_close()


def task_and_traj() -> tuple[Task, Trajectory]:
    task = Task(
        id="v1",
        benchmark="vitabench",
        user_turns=["Order two coffees"],
        gold=[[ToolCall("order", {"item": "coffee", "qty": 2})]],
    )
    traj = Trajectory(
        task,
        [
            Message("user", "Order two coffees"),
            Message("assistant", tool_calls=[ToolCall("order", {"item": "coffee", "qty": 2})]),
            Message("tool", '{"ok": true}', name="order"),
            Message("assistant", "Done."),
        ],
    )
    return task, traj


def judge(url: str, **kw: Any) -> LLMJudge:
    return LLMJudge(base_url=url, model="m", timeout=5, **kw)


def test_good_verdict(server: tuple[str, Stub], monkeypatch: pytest.MonkeyPatch) -> None:
    url, stub = server
    stub.replies = [(200, 'Sure.\n```json\n{"score": 0.75, "checks": [], "reason": "qty ok"}\n```')]
    monkeypatch.setenv("ENVACE_JUDGE_API_KEY", "k123")
    monkeypatch.setenv("OPENAI_API_KEY", "never-sent")
    out = judge(url)(*task_and_traj())
    assert out.score == 0.75 and not out.success and out.details["verdict"]["reason"] == "qty ok"
    assert len(stub.requests) == 1
    req = stub.requests[0]
    assert req["model"] == "m" and req["temperature"] == 0.0 and req["max_tokens"] == 1024
    assert "order" in req["messages"][1]["content"] and "Order two coffees" in req["messages"][1]["content"]
    assert stub.headers[0]["authorization"] == "Bearer k123"
    # the key comes only from the variable the config names; without it, the local-server placeholder
    judge(url, api_key_env="NO_SUCH_VARIABLE")(*task_and_traj())
    judge(url, api_key_env=None)(*task_and_traj())
    assert [h["authorization"] for h in stub.headers[1:]] == ["Bearer EMPTY"] * 2


@pytest.mark.parametrize(
    "text", ["I think it is fine", '{"score": 1.5}', '{"score": "1"}', '{"score": true}', '{"verdict": 1}', ""]
)
def test_garbage_verdict_is_masked(server: tuple[str, Stub], text: str) -> None:
    url, stub = server
    stub.replies = [(200, text)]
    out = judge(url)(*task_and_traj())
    assert out.masked and out.score is None and not out.success and out.details["judge_failures"] == {"verdict": 1}
    assert len(stub.requests) == 1  # a readable but unusable verdict is not retried


def test_server_error_then_success_is_retried_with_backoff(server: tuple[str, Stub]) -> None:
    url, stub = server
    stub.replies = [(503, ""), (500, ""), (200, '{"score": 1}')]
    start = time.monotonic()
    out = judge(url, max_retries=3)(*task_and_traj())
    elapsed = time.monotonic() - start
    assert out.score == 1.0 and out.success and out.details["judge_failures"] == {"http_503": 1, "http_500": 1}
    # the client retried, with its exponential back-off: 0.5 s, then 1 s, each less up to 25 % jitter
    assert [h["x-stainless-retry-count"] for h in stub.headers] == ["0", "1", "2"]
    assert 1.1 < elapsed < 3.0, elapsed


def test_persistent_failure_and_client_error_are_masked(server: tuple[str, Stub]) -> None:
    url, stub = server
    stub.replies = [(502, "")]
    out = judge(url, max_retries=2)(*task_and_traj())
    assert out.masked and "HTTP 502" in out.details["error"] and out.details["judge_failures"] == {"http_502": 3}
    assert len(stub.requests) == 3
    stub.requests.clear()
    stub.replies = [(400, "")]
    out = judge(url)(*task_and_traj())
    assert out.masked and len(stub.requests) == 1 and out.details["judge_failures"] == {"http_400": 1}  # not retried


def test_unreachable_endpoint_is_masked() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = judge(f"http://127.0.0.1:{port}/v1", max_retries=1)(*task_and_traj())
    assert out.masked and out.details["judge_failures"] == {"connection": 2}


def test_prompt_checklist_and_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    task, traj = task_and_traj()
    assert checklist(task) == [
        "The assistant fulfils the user request: Order two coffees",
        'The assistant calls order with arguments {"item": "coffee", "qty": 2}',
    ]
    task.extra["checklist"] = ["Two coffees were ordered", "The user was told"]
    msgs = build_prompt(task, traj)
    assert "1. Two coffees were ordered\n2. The user was told" in msgs[1]["content"]
    # the tool's answer is not shown (a rehearsal could claim success or address the judge); the call is
    assert '{"ok": true}' not in msgs[1]["content"] and "TOOL (order): [response not shown" in msgs[1]["content"]
    assert 'call order({"item": "coffee", "qty": 2})' in msgs[1]["content"]
    assert parse_verdict('x {"a": {"b": 1}} {"score": 0}')["score"] == 0
    monkeypatch.delenv("ENVACE_JUDGE_URL", raising=False)
    with pytest.raises(ValueError, match="no judge endpoint"):  # a judge reward without a judge is misconfigured
        judge_reward(task, traj)


def test_a_judge_called_inside_a_running_event_loop(server: tuple[str, Stub]) -> None:
    # a notebook runs an event loop in the calling thread; the judge then runs its own in a worker thread
    import asyncio

    url, stub = server
    stub.replies = [(200, '{"score": 0.5}')]

    async def inside() -> float | None:
        return judge(url)(*task_and_traj()).score

    assert asyncio.run(inside()) == 0.5 and len(stub.requests) == 1
