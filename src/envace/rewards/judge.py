"""An optional LLM judge over an OpenAI-compatible chat endpoint (standard library only).

The judge reads a checklist built from the task and the episode's transcript, and answers with a
JSON verdict ``{"score": <0..1>, "checks": [...], "reason": "..."}``. Transport failures are
retried with exponential backoff; anything that still fails — the endpoint, the envelope, or a
verdict without a score in [0, 1] — masks the episode (``score=None``), never scores it 0
(DESIGN.md §1: upstream masks judge failures).
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envace.rewards.base import RewardOutput
from envace.types import Message, Task, Trajectory

SYSTEM = (
    "You grade a tool-using assistant. Read the checklist and the transcript, decide for each item "
    "whether the transcript satisfies it, and answer with only a JSON object: "
    '{"score": <number from 0 to 1: the fraction of items satisfied>, '
    '"checks": [{"item": <text>, "passed": <true|false>}], "reason": <one sentence>}.'
)
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


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


def parse_verdict(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that has a numeric ``score`` in [0, 1], else ``None``.

    >>> parse_verdict('```json\\n{"score": 0.5, "reason": "half"}\\n```')["score"]
    0.5
    >>> parse_verdict('{"score": "high"}') is None, parse_verdict("no json") is None
    (True, True)
    """
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        score = obj.get("score") if isinstance(obj, dict) else None
        if isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score):
            return obj if 0.0 <= score <= 1.0 else None
        start = text.find("{", start + 1)
    return None


class JudgeError(RuntimeError):
    """The endpoint failed (after retries) or answered with an unusable envelope."""


@dataclass
class LLMJudge:
    """A reward function ``(task, traj) -> RewardOutput`` backed by an LLM judge.

    Args:
        base_url: the endpoint root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is added).
        model: model name sent in the request.
        api_key_env: name of the environment variable holding a bearer token; unset = no header.
        timeout: seconds per HTTP request.
        max_retries: retries after the first attempt, on connection errors, timeouts and HTTP
            408/409/425/429/5xx.
        backoff: seconds before the first retry; doubles each retry.
        success_threshold: ``success`` is ``score >= success_threshold``.
        max_tokens: completion budget of the verdict.
        sleep: the wait function (tests replace it).
    """

    base_url: str
    model: str = "judge"
    api_key_env: str | None = "ENVACE_JUDGE_API_KEY"
    timeout: float = 60.0
    max_retries: int = 3
    backoff: float = 1.0
    success_threshold: float = 1.0
    max_tokens: int = 1024
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = self.base_url.rstrip("/") + "/chat/completions"
        request = urllib.request.Request(url, json.dumps(payload).encode(), headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read().decode("utf-8"))  # type: ignore[no-any-return]

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant text of one chat completion, with retries; raises :class:`JudgeError`."""
        payload = {"model": self.model, "messages": messages, "temperature": 0.0, "max_tokens": self.max_tokens}
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                body = self._post(payload)
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
                if exc.code not in RETRY_STATUS:
                    break
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            try:
                return str(body["choices"][0]["message"]["content"])
            except (KeyError, IndexError, TypeError):
                raise JudgeError(f"unexpected response envelope: {str(body)[:200]}") from None
        raise JudgeError(f"judge endpoint failed after {attempt + 1} attempt(s): {last}")

    def __call__(self, task: Task, traj: Trajectory) -> RewardOutput:
        try:
            text = self.complete(build_prompt(task, traj))
        except JudgeError as exc:
            return RewardOutput(None, False, {"error": str(exc)})
        verdict = parse_verdict(text)
        if verdict is None:
            return RewardOutput(None, False, {"error": "no verdict with a score in [0, 1]", "raw": text[:500]})
        score = float(verdict["score"])
        return RewardOutput(score, score >= self.success_threshold, {"verdict": verdict})

    @classmethod
    def from_env(cls) -> LLMJudge | None:
        """A judge configured by ``ENVACE_JUDGE_URL`` (and optional ``ENVACE_JUDGE_MODEL``), or ``None``."""
        url = os.environ.get("ENVACE_JUDGE_URL")
        if not url:
            return None
        return cls(base_url=url, model=os.environ.get("ENVACE_JUDGE_MODEL", "judge"))


def judge_reward(task: Task, traj: Trajectory) -> RewardOutput:
    """The registry's ``judge`` reward: :meth:`LLMJudge.from_env`; masked when no endpoint is set."""
    judge = LLMJudge.from_env()
    if judge is None:
        return RewardOutput(None, False, {"error": "no judge endpoint: set ENVACE_JUDGE_URL"})
    return judge(task, traj)
