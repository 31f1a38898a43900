"""The judge (the ``openai`` client under a bounded transport) against a misbehaving endpoint: a raw TCP
server on 127.0.0.1 that trickles, breaks the status line, cuts the body, sends bytes that are not
UTF-8, JSON of the wrong shape, or a long Retry-After. Every case is masked (or, after one failure,
scored), counted by kind, within its deadline, and never raises."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from envace.rewards import JudgeSettings, RewardError, RewardOutput, compute_reward
from envace.rewards.judge import LLMJudge, settings_from_env
from envace.types import Message, Task, Trajectory

Script = Callable[[socket.socket, threading.Event], None]


def _read_request(conn: socket.socket) -> bytes:
    """The request's headers and body (by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
    while len(body) < length and (chunk := conn.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body  # the body may come in a later packet than the headers


def _session(conn: socket.socket, script: Script, stop: threading.Event, requests: list[bytes]) -> None:
    with conn:
        conn.settimeout(5.0)
        try:
            requests.append(_read_request(conn))
            script(conn, stop)
        except OSError:  # the client gave up: the point of most cases
            pass


@contextmanager
def endpoint(*scripts: Script, lifetime: float = 20.0) -> Iterator[tuple[str, list[bytes]]]:
    """``http://127.0.0.1:<port>/v1`` answering its i-th connection with ``scripts[i]`` (the last one
    repeats), at most 16 connections; it stops by itself after ``lifetime`` seconds, or at the end."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    stop, requests, sessions = threading.Event(), [], []

    def serve() -> None:
        end = time.monotonic() + lifetime
        while not stop.is_set() and time.monotonic() < end and len(sessions) < 16:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            script = scripts[min(len(sessions), len(scripts) - 1)]
            sessions.append(threading.Thread(target=_session, args=(conn, script, stop, requests), daemon=True))
            sessions[-1].start()
        stop.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1", requests
    finally:
        stop.set()
        thread.join(timeout=2)
        for s in sessions:
            s.join(timeout=2)
        server.close()


def reply(body: bytes, status: str = "200 OK", extra: str = "") -> Script:
    def script(conn: socket.socket, stop: threading.Event) -> None:
        head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        conn.sendall(head.encode() + body)

    return script


def chat(text: str) -> Script:
    return reply(json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode())


def raw(data: bytes) -> Script:
    """``data`` as it is, then the connection closes."""
    return lambda conn, stop: conn.sendall(data)


def trickle(head: bytes, interval: float) -> Script:
    """``head``, then one more byte every ``interval`` seconds for ever (until the client or the test goes)."""

    def script(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        for byte in itertools.repeat(b"a"):
            if stop.wait(interval):
                return
            conn.sendall(byte)

    return script


TRICKLE_STATUS = trickle(b"", 0.25)  # never finishes its status line
TRICKLE_BODY = trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", 0.25)  # nor its body


def task_and_traj() -> tuple[Task, Trajectory]:
    task = Task(id="j1", benchmark="vitabench", user_turns=["Order a tea"], extra={"reward": "judge"})
    return task, Trajectory(task, [Message("user", "Order a tea"), Message("assistant", "Ordered.")])


def judge(url: str, **kw: Any) -> LLMJudge:
    return LLMJudge(**{"base_url": url, "model": "m", "timeout": 5.0, "max_retries": 1, **kw})


GOOD = '{"score": 1, "checks": [], "reason": "ok"}'


BROKEN = [  # (what the endpoint does, the failed attempts by kind with one retry, a word of the error)
    (raw(b"NOT HTTP AT ALL\r\n\r\n"), {"protocol": 2}, "RemoteProtocolError"),
    (raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b'{"choices'), {"protocol": 2}, "complete message"),
    (raw(b""), {"protocol": 2}, "disconnected"),  # closed without a word
    (reply(b'\xff{"choices": []}'), {"decode": 1}, "UnicodeDecodeError"),
    (reply(b'\xff\xfe{"choices": []}'), {"decode": 1}, "utf-16"),  # a byte-order mark, then nonsense
    (reply(b'{"choices": [{"message": '), {"json": 1}, "JSONDecodeError"),
    (reply(b'{"choices": ' + b"[" * 4000), {"json": 1}, "RecursionError"),
    (reply(b'{"choices": [{"message": {"content": 1' + b"1" * 5000 + b"}}]}"), {"json": 1}, "digits"),
    (reply(b'{"choices": [{"message": {"content": null}}]}'), {"envelope": 1}, "envelope"),
    (reply(b'["choices"]'), {"envelope": 1}, "envelope"),
    (reply(b"{}", "503 Busy"), {"http_503": 2}, "HTTP 503"),
    (reply(b"{}", "401 No"), {"http_401": 1}, "HTTP 401"),
    (raw(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"), {"too_large": 1}, "too_large"),
    (raw(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 9000), {"too_large": 1}, "over 8192 bytes"),
    (chat("no verdict here"), {"verdict": 1}, "no verdict"),
    (chat('{"score": 1' + "1" * 5000 + "}"), {"verdict": 1}, "no verdict"),  # an integer past the digit limit
]


@pytest.mark.parametrize(("script", "failures", "why"), BROKEN, ids=[why for *_, why in BROKEN])
def test_a_broken_endpoint_is_masked_and_counted(script: Script, failures: dict[str, int], why: str) -> None:
    with endpoint(script) as (url, requests):
        j = judge(url, max_response_bytes=8192)
        out = j(*task_and_traj())
    assert out.masked and not out.success and why in str(out.details), out.details
    assert out.details["judge_failures"] == failures == dict(j.failures)
    assert len(requests) == sum(failures.values())  # retried only where it may pass: the client's choice


@pytest.mark.parametrize(
    "first",
    [raw(b""), raw(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{"), TRICKLE_STATUS],
    ids=["disconnect", "cut-body", "trickle"],
)
def test_one_failure_then_a_verdict_is_scored(first: Script) -> None:
    with endpoint(first, chat(GOOD)) as (url, requests):
        out = judge(url, timeout=1.0)(*task_and_traj())
    assert out.score == 1.0 and out.success and len(requests) == 2
    assert sum(out.details["judge_failures"].values()) == 1  # protocol, or timeout for the trickle


@pytest.mark.parametrize("script", [TRICKLE_STATUS, TRICKLE_BODY], ids=["status-line", "body"])
def test_a_trickling_server_is_cut_at_the_call_deadline(script: Script) -> None:
    # a byte every 0.25 s: a per-read timeout of 1 s would wait for ever; the call's 1 s does not
    with endpoint(script) as (url, _):
        j = judge(url, timeout=1.0, max_retries=0)
        start = time.monotonic()
        out = j(*task_and_traj())
        elapsed = time.monotonic() - start
    assert out.masked and out.details["judge_failures"] == {"timeout": 1}
    assert 0.9 < elapsed < 1.5, elapsed


def test_the_episode_budget_bounds_retries_and_backoff() -> None:
    # 1 s per attempt, the client's back-off of 0.375-0.5 s, a 2 s budget: the first attempt times out
    # at 1 s, the second starts by 1.5 s and is cut by the budget at 2 s; four more were allowed
    with endpoint(TRICKLE_BODY) as (url, requests):
        j = LLMJudge(base_url=url, timeout=1.0, max_retries=5, budget=2.0)
        start = time.monotonic()
        out = j(*task_and_traj())
        elapsed = time.monotonic() - start
    assert out.masked and out.details["judge_failures"] == {"timeout": 2} and len(requests) == 2
    assert "budget of 2 s spent after 2 attempt(s)" in out.details["error"]
    assert 1.9 < elapsed < 2.5, elapsed


def test_a_long_retry_after_cannot_hold_the_episode() -> None:
    # the client honours Retry-After up to two minutes; the budget still ends the episode
    with endpoint(reply(b"{}", "503 Busy", "Retry-After: 100\r\n")) as (url, requests):
        start = time.monotonic()
        out = LLMJudge(base_url=url, timeout=1.0, max_retries=2, budget=1.5)(*task_and_traj())
        elapsed = time.monotonic() - start
    assert out.masked and out.details["judge_failures"] == {"http_503": 1} and len(requests) == 1
    assert "budget of 1.5 s spent" in out.details["error"] and 1.4 < elapsed < 2.0, elapsed


def test_the_registry_passes_the_settings_and_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with endpoint(chat('{"score": 0.5}')) as (url, requests):
        out = compute_reward(*task_and_traj(), judge=JudgeSettings(base_url=url, model="cfg-judge"))
        assert out.score == 0.5 and out.details["judge_failures"] == {}
        assert json.loads(requests[0].split(b"\r\n\r\n", 1)[1])["model"] == "cfg-judge"
        monkeypatch.setenv("ENVACE_JUDGE_URL", url)
        monkeypatch.setenv("ENVACE_JUDGE_MODEL", "env-judge")
        monkeypatch.setenv("ENVACE_JUDGE_TIMEOUT", "2")
        assert compute_reward(*task_and_traj()).score == 0.5
        assert json.loads(requests[1].split(b"\r\n\r\n", 1)[1])["model"] == "env-judge"
    assert settings_from_env().timeout == 2.0 and settings_from_env(budget=9).budget == 9
    monkeypatch.setenv("ENVACE_JUDGE_RETRIES", "-1")
    with pytest.raises(RewardError, match="out of range"):  # a bad setting is a bug of the run: it stops
        compute_reward(*task_and_traj())
    monkeypatch.delenv("ENVACE_JUDGE_RETRIES")
    monkeypatch.delenv("ENVACE_JUDGE_URL")
    with pytest.raises(RewardError, match="no judge endpoint"):  # so is a judge reward with no judge
        compute_reward(*task_and_traj())


def test_an_outage_masks_the_episode_and_is_counted() -> None:
    from envace.callbacks.rollout import reward_metrics

    task, traj = task_and_traj()
    out = compute_reward(task, traj, judge=JudgeSettings(base_url="http://127.0.0.1:9/v1", timeout=0.5, max_retries=0))
    assert out.masked and out.details["judge_failures"] == {"connection": 1}
    episodes = [SimpleNamespace(task=task)] * 2
    assert reward_metrics(episodes, [out, RewardOutput(0.5)])["reward/masked"] == 1.0


def test_a_pathological_verdict_is_searched_in_bounded_time() -> None:
    # every "{" starts a parse that fails at an offset as large as the text: quadratic without a cap
    with endpoint(chat("{" * 900_000)) as (url, _):
        j = judge(url, max_response_bytes=1 << 20)
        start = time.monotonic()
        out = j(*task_and_traj())
        elapsed = time.monotonic() - start
    assert out.masked and out.details["judge_failures"] == {"verdict": 1} and elapsed < 5, elapsed


def test_default_worst_case_is_bounded() -> None:
    s = JudgeSettings()
    attempts = s.max_retries + 1  # the client's back-off before retry k is at most 0.5 * 2 ** (k - 1) s
    assert s.budget == 45.0 and s.budget <= attempts * s.timeout + 0.5 * (2 ** (attempts - 1) - 1)
