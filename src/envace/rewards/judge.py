"""An optional LLM judge over an OpenAI-compatible chat endpoint, through the ``openai`` client.

The judge reads a checklist built from the task and the episode's transcript, and answers with a
JSON verdict ``{"score": <0..1>, "checks": [...], "reason": "..."}``.

``openai.AsyncOpenAI`` sends the request, retries it (timeouts, connection and protocol errors,
HTTP 408/409/429/5xx, with its exponential back-off and the server's ``Retry-After``) and reads the
completion. The endpoint is untrusted: it may hang, trickle bytes, cut a body short, send a broken
status line, a body that is not JSON, or JSON of the wrong shape. The client's timeout is per read,
so a server that trickles a byte a second would hold it for ever; here every attempt has a total
deadline (:class:`BoundedTransport`: connect, send, status line and the whole body, capped in
size), every episode a total budget over its attempts and back-off (:class:`JudgeSettings`: 45 s at
most by default), and every failure is caught: the episode is masked (``score=None``), never scored
0 (docs/design.md §1: upstream masks judge failures), and each failed attempt is counted by kind in
``details["judge_failures"]``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, Self, TypeVar, cast

import httpx2
import openai
from openai.types.chat import ChatCompletionMessageParam

from envace.rewards.base import RewardOutput
from envace.types import Message, Task, Trajectory

SYSTEM = (
    "You grade a tool-using assistant. Read the checklist and the transcript, decide for each item "
    "whether the transcript satisfies it, and answer with only a JSON object: "
    '{"score": <number from 0 to 1: the fraction of items satisfied>, '
    '"checks": [{"item": <text>, "passed": <true|false>}], "reason": <one sentence>}.'
)
#: the settings that ``ENVACE_JUDGE_*`` environment variables set (:func:`settings_from_env`)
ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "base_url": ("ENVACE_JUDGE_URL", str),
    "model": ("ENVACE_JUDGE_MODEL", str),
    "timeout": ("ENVACE_JUDGE_TIMEOUT", float),
    "max_retries": ("ENVACE_JUDGE_RETRIES", int),
    "budget": ("ENVACE_JUDGE_BUDGET", float),
}


def checklist(task: Task) -> list[str]:
    """The items to grade: ``task.extra["checklist"]`` (or ``"rubric"``) when the source gives one,
    else one item per user request and per gold call.

    >>> from envace.types import ToolCall
    >>> checklist(Task(id="t", benchmark="x", user_turns=["Book it"], gold=[[ToolCall("book", {"id": 1})]]))
    ['The assistant fulfils the user request: Book it', 'The assistant calls book with arguments {"id": 1}']
    """
    given = task.extra.get("checklist") or task.extra.get("rubric")
    if given:
        return [str(x) for x in given] if isinstance(given, list) else [str(given)]
    items = [f"The assistant fulfils the user request: {u}" for u in task.user_turns if u]
    items += [
        f"The assistant calls {c.name} with arguments {json.dumps(c.arguments, sort_keys=True)}"
        for turn in task.gold
        for c in turn
    ]
    return items or ["The assistant completes the task correctly."]


def _render(m: Message, limit: int) -> str:
    """One transcript line. A tool message's content is left out: in training it is the policy's own
    rehearsal (or a simulator's), which could claim success or address the judge; the judge grades
    the calls made and what the assistant said, the same for every training arm."""
    if m.role == "tool":
        return f"TOOL ({m.name}): [response not shown: the calls are graded, not what answered them]"
    text = m.content if len(m.content) <= limit else m.content[:limit] + " …[truncated]"
    calls = "".join(f"\n  call {c.name}({json.dumps(c.arguments, sort_keys=True)})" for c in m.tool_calls)
    who = m.role.upper() + (f" ({m.name})" if m.name else "")
    return f"{who}: {text}{calls}"


def build_prompt(task: Task, traj: Trajectory, max_chars_per_message: int = 2000) -> list[dict[str, str]]:
    """Chat messages for the judge: the grading instructions, then checklist and transcript."""
    items = "\n".join(f"{i}. {x}" for i, x in enumerate(checklist(task), start=1))
    transcript = "\n".join(_render(m, max_chars_per_message) for m in traj.messages)
    user = f"Checklist:\n{items}\n\nTranscript:\n{transcript}\n\nAnswer with the JSON object only."
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str, limit: int = 32_768) -> dict[str, Any] | None:
    """The first JSON object in ``text[:limit]`` that has a numeric ``score`` in [0, 1], else ``None``.

    Only the first ``limit`` characters are searched: a verdict is at most ``max_tokens`` long, and
    each failed parse costs time in proportion to its offset, so an endpoint that sends a megabyte
    of ``{`` would otherwise hold the search for minutes (32 KiB: under a second in the worst case).

    >>> parse_verdict('```json\\n{"score": 0.5, "reason": "half"}\\n```')["score"]
    0.5
    >>> parse_verdict('{"score": "high"}') is None, parse_verdict("no json") is None
    (True, True)
    """
    text = text[:limit]
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):  # not JSON, nested too deep, an integer too long
            start = text.find("{", start + 1)
            continue
        score = obj.get("score") if isinstance(obj, dict) else None
        if isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score):
            return obj if 0.0 <= score <= 1.0 else None
        start = text.find("{", start + 1)
    return None


class JudgeError(RuntimeError):
    """The endpoint failed: on every attempt, on one not worth retrying, or until the budget ran out."""


class TooLarge(openai.OpenAIError):
    """A response body over the size cap (an ``OpenAIError``: the client passes it on, unretried)."""


class BadAnswer(ValueError):
    """The endpoint answered, but not with a usable completion: ``kind`` is ``decode`` (not UTF-8),
    ``json`` (not JSON) or ``envelope`` (JSON of the wrong shape)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


#: the kind of a failed attempt the transport saw, first match wins (``http_<status>`` for statuses)
KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (httpx2.TimeoutException, "timeout"),
    (httpx2.ProtocolError, "protocol"),  # a broken status line, a body cut short, closed without a word
    (httpx2.TransportError, "connection"),  # refused, reset, unreachable, name resolution
    (OSError, "connection"),  # TLS, and what the client wraps as a connection error
)


class BoundedTransport(httpx2.AsyncBaseTransport):
    """httpx's transport with each attempt bounded in time and size, and its outcome recorded.

    Connecting, sending, the status line and the whole body end within ``timeout`` seconds in all
    (httpx's own timeouts are per operation, so a trickling server never trips them), else the
    attempt fails as ``httpx2.ReadTimeout``, which the client retries. The decoded body is read here,
    at most ``max_bytes`` (more: :class:`TooLarge`). Every attempt that fails appends its kind to
    ``failures``: a kind of :data:`KINDS`, ``http_<status>`` or ``too_large``.
    """

    def __init__(self, timeout: float, max_bytes: int, failures: list[str]) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.timeout, self.max_bytes, self.failures = timeout, max_bytes, failures

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await asyncio.wait_for(self._whole(request), self.timeout)
        except TimeoutError:
            self.failures.append("timeout")
            raise httpx2.ReadTimeout(f"no whole answer within {self.timeout:g} s", request=request) from None
        except TooLarge:
            self.failures.append("too_large")
            raise
        except asyncio.CancelledError:  # the episode's budget ran out during this attempt
            self.failures.append("timeout")
            raise
        except Exception as exc:
            self.failures.append(next((kind for cls, kind in KINDS if isinstance(exc, cls)), "other"))
            raise
        if response.status_code >= 400:
            self.failures.append(f"http_{response.status_code}")
        return response

    async def _whole(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await response.aclose()
            raise TooLarge(f"too_large: a response of {declared} bytes (limit {self.max_bytes})")
        body = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.max_bytes:
                    raise TooLarge(f"too_large: a response over {self.max_bytes} bytes")
        finally:
            await response.aclose()
        skip = {"content-encoding", "content-length", "transfer-encoding"}  # the body is decoded and whole
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in skip]
        return httpx2.Response(response.status_code, headers=headers, content=bytes(body), request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


T = TypeVar("T")


def run_coroutine(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())``; in a thread of its own when this one already runs a loop (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def describe(exc: BaseException) -> str:
    """A failed call in one short line."""
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}"
    cause = exc.__cause__ if isinstance(exc, openai.APIConnectionError) and exc.__cause__ else exc
    return f"{type(cause).__name__}: {cause}"[:300]


def content_of(completion: Any) -> str:
    """The assistant text of a parsed completion; :class:`BadAnswer` (``envelope``) for anything else
    (the client builds its models without validation, and returns text for a body not typed JSON)."""
    try:
        content = completion.choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        content = None
    if not isinstance(content, str):
        raise BadAnswer("envelope", f"unexpected response envelope: {str(completion)[:200]!r}")
    return content


@dataclass(frozen=True)
class JudgeSettings:
    """Where the judge is and how long it may take: the judge's part of a config.

    With the defaults an episode waits **at most 45 s** for its verdict (``budget``): three attempts
    of at most 20 s each with the client's back-off between them (0.5 s, then 1 s, less jitter),
    cut off at 45 s, whatever the endpoint does (a ``Retry-After`` of two minutes included).

    Args:
        base_url: the endpoint root, e.g. ``http://127.0.0.1:8000/v1`` (the client adds
            ``/chat/completions``); ``None``: no judge configured — the ``judge`` reward then raises
            (a run whose every episode would be masked is a configuration error, not an outage).
        model: model name sent in the request.
        api_key_env: name of the environment variable holding the API key (sent as a bearer token);
            unset or empty: the placeholder ``EMPTY`` that local OpenAI-compatible servers accept.
            ``OPENAI_API_KEY`` is never read: a key goes only where its variable is named.
        timeout: seconds one attempt may take in all (connect, send, every read), not per read.
        max_retries: the client's retries after the first attempt (timeouts, connection and protocol
            errors, HTTP 408/409/429/5xx; a body that is not a usable completion is not retried: it
            would answer the same).
        budget: seconds one episode may spend on the judge, attempts and back-off together.
        success_threshold: ``success`` is ``score >= success_threshold``.
        max_tokens: completion budget of the verdict.
        max_response_bytes: a longer response body fails the attempt (``too_large``) unread.
    """

    base_url: str | None = None
    model: str = "judge"
    api_key_env: str | None = "ENVACE_JUDGE_API_KEY"
    timeout: float = 20.0
    max_retries: int = 2
    budget: float = 45.0
    success_threshold: float = 1.0
    max_tokens: int = 1024
    max_response_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        positive = all(math.isfinite(x) and x > 0 for x in (self.timeout, self.budget, self.max_response_bytes))
        if not positive or self.max_retries < 0:
            raise ValueError(f"judge settings out of range: {self}")


def settings_from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> JudgeSettings:
    """The defaults, then the ``ENVACE_JUDGE_*`` variables that are set (:data:`ENV`), then ``overrides``.

    >>> settings_from_env({"ENVACE_JUDGE_URL": "http://127.0.0.1:9/v1", "ENVACE_JUDGE_BUDGET": "10"}, max_retries=0)
    JudgeSettings(base_url='http://127.0.0.1:9/v1', model='judge', api_key_env='ENVACE_JUDGE_API_KEY', \
timeout=20.0, max_retries=0, budget=10.0, success_threshold=1.0, max_tokens=1024, max_response_bytes=1048576)
    """
    env = os.environ if environ is None else environ
    given = {name: parse(env[var]) for name, (var, parse) in ENV.items() if env.get(var)}
    return JudgeSettings(**{**given, **overrides})


@dataclass(frozen=True)
class LLMJudge(JudgeSettings):
    """A reward function ``(task, traj) -> RewardOutput`` backed by an LLM judge (its settings:
    :class:`JudgeSettings`).

    Args:
        failures: failed attempts by kind over this judge's life, for logs; each episode's own are
            in its ``details["judge_failures"]`` (exact while one thread uses the judge).
    """

    failures: Counter[str] = field(default_factory=Counter, repr=False, compare=False)

    async def _complete(self, messages: list[dict[str, str]], failed: list[str]) -> str:
        transport = BoundedTransport(self.timeout, self.max_response_bytes, failed)
        key = (os.environ.get(self.api_key_env) if self.api_key_env else None) or "EMPTY"
        async with openai.AsyncOpenAI(
            base_url=str(self.base_url),
            api_key=key,
            timeout=self.timeout,
            max_retries=self.max_retries,
            http_client=httpx2.AsyncClient(transport=transport, timeout=self.timeout),
        ) as client:
            completion = await client.chat.completions.create(
                model=self.model,
                messages=cast("list[ChatCompletionMessageParam]", messages),
                temperature=0.0,
                max_tokens=self.max_tokens,
            )
        return content_of(completion)

    async def _within_budget(self, messages: list[dict[str, str]], failed: list[str]) -> str:
        try:
            return await asyncio.wait_for(self._complete(messages, failed), self.budget)
        except TimeoutError:
            raise JudgeError(f"judge budget of {self.budget:g} s spent after {len(failed)} attempt(s)") from None

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant text of one chat completion within ``budget`` seconds, retried by the client;
        raises :class:`JudgeError`. Each failed attempt counts in :attr:`failures` by kind."""
        failed: list[str] = []
        try:
            return run_coroutine(lambda: self._within_budget(messages, failed))
        except (openai.APIStatusError, openai.APIConnectionError, TooLarge) as exc:  # the transport counted it
            raise JudgeError(f"judge endpoint failed after {len(failed)} attempt(s): {describe(exc)}") from exc
        except (ValueError, RecursionError) as exc:  # the body of a 200: not UTF-8, not JSON, not a completion
            kind = exc.kind if isinstance(exc, BadAnswer) else "json"
            kind = "decode" if isinstance(exc, UnicodeDecodeError) else kind
            failed.append(kind)
            raise JudgeError(f"judge endpoint sent no usable completion ({kind}): {describe(exc)}") from exc
        finally:
            self.failures.update(failed)

    def __call__(self, task: Task, traj: Trajectory) -> RewardOutput:
        """The verdict's score; masked (``score=None``) when the judge fails, with this episode's
        failed attempts by kind in ``details["judge_failures"]``."""
        if not self.base_url:  # a configuration error, not an outage: every episode would be masked
            raise ValueError("no judge endpoint: set ENVACE_JUDGE_URL (or model.init_args.judge.base_url)")
        before = self.failures.copy()
        try:
            text = self.complete(build_prompt(task, traj))
        except JudgeError as exc:
            return RewardOutput(None, False, {"error": str(exc), "judge_failures": dict(self.failures - before)})
        verdict = parse_verdict(text)
        if verdict is None:
            self.failures["verdict"] += 1
            error = {"error": "no verdict with a score in [0, 1]", "raw": text[:500]}
            return RewardOutput(None, False, {**error, "judge_failures": dict(self.failures - before)})
        score = float(verdict["score"])
        details = {"verdict": verdict, "judge_failures": dict(self.failures - before)}
        return RewardOutput(score, score >= self.success_threshold, details)

    @classmethod
    def from_settings(cls, settings: JudgeSettings, **kw: Any) -> Self:
        """A judge with ``settings``."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(JudgeSettings)}, **kw)

    @classmethod
    def from_env(cls) -> Self | None:
        """A judge configured by ``ENVACE_JUDGE_*`` (:func:`settings_from_env`), or ``None`` without
        ``ENVACE_JUDGE_URL``."""
        settings = settings_from_env()
        return cls.from_settings(settings) if settings.base_url else None


def judge_reward(task: Task, traj: Trajectory) -> RewardOutput:
    """The registry's ``judge`` reward, configured by ``ENVACE_JUDGE_*`` (or pass
    :class:`JudgeSettings` to :func:`envace.rewards.compute_reward`); an endpoint that fails masks the
    episode, a missing or invalid setting raises."""
    return LLMJudge.from_settings(settings_from_env())(task, traj)
