"""An optional LLM judge over an OpenAI-compatible chat endpoint (standard library only).

The judge reads a checklist built from the task and the episode's transcript, and answers with a
JSON verdict ``{"score": <0..1>, "checks": [...], "reason": "..."}``.

The endpoint is untrusted: it may hang, trickle bytes, cut a body short, send a broken status line,
a body that is not UTF-8 or not JSON, or JSON of the wrong shape. So every call has a total
deadline (checked before every socket read, not per read), every episode a total budget over its
attempts and back-off (:class:`JudgeSettings`: 45 s at most by default), and every failure is
caught: retried when another attempt may pass, then the episode is masked (``score=None``), never
scored 0 (docs/design.md §1: upstream masks judge failures), and each failed attempt is counted by kind
in ``details["judge_failures"]`` (:func:`failure_kind`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self

from envace.rewards.base import RewardOutput
from envace.rewards.judge_http import RETRIED, TRANSPORT_ERRORS, JudgeError, describe, failure_kind, post_chat
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


@dataclass(frozen=True)
class JudgeSettings:
    """Where the judge is and how long it may take: the judge's part of a config.

    With the defaults an episode waits **at most 45 s** for its verdict (``budget``): three attempts
    of at most 20 s each with 1 s and 2 s of back-off, cut off at 45 s. (Before: 60 s per *read* and
    4 attempts, 247 s when every read timed out, and no bound at all for a server that trickles.)
    Resolving the host name is outside the deadline (the standard library cannot bound it): give an
    IP address or a host the local resolver answers.

    Args:
        base_url: the endpoint root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is
            added); ``None``: no judge configured — the ``judge`` reward then raises (a run whose
            every episode would be masked is a configuration error, not an outage).
        model: model name sent in the request.
        api_key_env: name of the environment variable holding a bearer token; unset = no header.
        timeout: seconds one HTTP call may take in all (connect, send, every read), not per read.
        max_retries: retries after the first attempt, on the kinds of :data:`RETRIED`: timeouts,
            connection and protocol errors, bodies that are not UTF-8 or not JSON, HTTP
            408/409/425/429/5xx.
        backoff: seconds before the first retry; doubles each retry.
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
    backoff: float = 1.0
    budget: float = 45.0
    success_threshold: float = 1.0
    max_tokens: int = 1024
    max_response_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        positive = all(math.isfinite(x) and x > 0 for x in (self.timeout, self.budget, self.max_response_bytes))
        if not positive or self.max_retries < 0 or not 0 <= self.backoff < math.inf:
            raise ValueError(f"judge settings out of range: {self}")


def settings_from_env(environ: Mapping[str, str] | None = None, **overrides: Any) -> JudgeSettings:
    """The defaults, then the ``ENVACE_JUDGE_*`` variables that are set (:data:`ENV`), then ``overrides``.

    >>> settings_from_env({"ENVACE_JUDGE_URL": "http://127.0.0.1:9/v1", "ENVACE_JUDGE_BUDGET": "10"}, max_retries=0)
    JudgeSettings(base_url='http://127.0.0.1:9/v1', model='judge', api_key_env='ENVACE_JUDGE_API_KEY', \
timeout=20.0, max_retries=0, backoff=1.0, budget=10.0, success_threshold=1.0, max_tokens=1024, \
max_response_bytes=1048576)
    """
    env = os.environ if environ is None else environ
    given = {name: parse(env[var]) for name, (var, parse) in ENV.items() if env.get(var)}
    return JudgeSettings(**{**given, **overrides})


@dataclass(frozen=True)
class LLMJudge(JudgeSettings):
    """A reward function ``(task, traj) -> RewardOutput`` backed by an LLM judge (its settings:
    :class:`JudgeSettings`).

    Args:
        sleep: the wait function (tests replace it).
        failures: failed attempts by kind over this judge's life, for logs; each episode's own are
            in its ``details["judge_failures"]`` (exact while one thread uses the judge).
    """

    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    failures: Counter[str] = field(default_factory=Counter, repr=False, compare=False)

    def _attempt(self, payload: dict[str, Any], deadline: float) -> str:
        """One POST that ends by ``deadline`` (``time.monotonic``): the assistant text, or one of
        :data:`TRANSPORT_ERRORS`."""
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = str(self.base_url).rstrip("/") + "/chat/completions"
        return post_chat(url, payload, headers, deadline, self.max_response_bytes)

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant text of one chat completion within ``budget`` seconds, retrying the kinds of
        :data:`RETRIED`; raises :class:`JudgeError`. Each failed attempt counts in :attr:`failures`."""
        payload = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": self.max_tokens}
        end, last = time.monotonic() + self.budget, ""
        for attempt in range(self.max_retries + 1):
            wait = self.backoff * 2 ** (attempt - 1) if attempt else 0.0
            if time.monotonic() + wait >= end:
                raise JudgeError(f"judge budget of {self.budget:g} s spent after {attempt} attempt(s): {last}")
            if attempt:
                self.sleep(wait)
            try:
                return self._attempt(payload, min(time.monotonic() + self.timeout, end))
            except TRANSPORT_ERRORS as exc:
                kind, last = failure_kind(exc), describe(exc)
                self.failures[kind] += 1
                if kind not in RETRIED:
                    break
        raise JudgeError(f"judge endpoint failed after {attempt + 1} attempt(s): {last}")

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
        """A judge with ``settings`` (``kw``: ``sleep``)."""
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
