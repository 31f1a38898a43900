"""The imagination memory: imagined attempts of a user turn, condensed into a note the policy reads.

An attempt is what the policy did in one imagined run of the turn: the calls it made, the results
it rehearsed for them (its own world model's predictions, never executed), the outcome it expected
(its final text), and the errors it hit (malformed calls, malformed rehearsals, limits). The note
lists the attempts in order; it is appended to the committed context as a system turn, after the
user turn and before the assistant header (see :mod:`envace.inference.imagine`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from envace.types import JSON, MAX_EPISODE_TOKENS, MAX_STEPS, TRUNCATED, CallRecord, is_error

HEADER = (
    "Private rehearsal of the request above (imagined: nothing was executed; every result below was "
    "predicted, not observed, and may be wrong)."
)
REVISED_HEADER = (
    "Private rehearsal again, from the real responses so far (a real response was not what the earlier "
    "rehearsal predicted; imagined: nothing below was executed, every result was predicted and may be wrong)."
)
FOOTER = "Use what helps, avoid the problems, and now handle the request for real."
LIMIT_FLAGS = {
    TRUNCATED: "the answer was cut off",
    MAX_STEPS: "it hit the step limit",
    MAX_EPISODE_TOKENS: "it ran out of context",
}


@dataclass
class Attempt:
    """One imagined attempt of a user turn.

    Attributes:
        calls: each call with the response rehearsed for it (or the structured error it got).
        outcome: the policy's final text of the turn (what it expected to tell the user), or "".
        format_errors: malformed or invalid calls the policy wrote.
        flags: limits that ended the attempt (``truncated``, ``max_steps``, ``max_episode_tokens``).
        tokens: tokens the policy generated in the attempt (act and rehearse).
    """

    calls: list[CallRecord] = field(default_factory=list)
    outcome: str = ""
    format_errors: int = 0
    flags: list[str] = field(default_factory=list)
    tokens: int = 0

    def errors(self) -> list[str]:
        """The errors the attempt hit, as short phrases."""
        out = [f"{_error_code(r.response)} from {r.call.name}" for r in self.calls if is_error(r.response)]
        if self.format_errors:
            out.append(f"{self.format_errors} malformed or invalid call(s)")
        out += [LIMIT_FLAGS.get(f, f) for f in self.flags]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": [r.to_dict() for r in self.calls],
            "outcome": self.outcome,
            "errors": self.errors(),
            "tokens": self.tokens,
        }


@dataclass
class ImaginedTurn:
    """What imagination spent and wrote before one committed user turn (``revised``: again, mid-turn,
    before the committed episode's ``at_call``-th call, after a real response it did not foresee)."""

    turn: int
    attempts: list[Attempt] = field(default_factory=list)
    memory_tokens: int = 0
    at_call: int = 0
    revised: bool = False

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.attempts)


def _error_code(response: JSON) -> str:
    err = response.get("error") if isinstance(response, dict) else None
    if isinstance(err, dict):
        return str(err.get("code", "ERROR"))
    return "ERROR"


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis.

    >>> clip("abcdef", 4), clip("abc", 4)
    ('abc…', 'abc')
    """
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def render_attempt(index: int, attempt: Attempt, max_chars: int = 200) -> str:
    """One attempt as a few lines of the note.

    >>> from envace.types import ToolCall
    >>> a = Attempt([CallRecord(ToolCall("ls", {}), {"files": ["a"]})], outcome="There is a.")
    >>> print(render_attempt(1, a))
    Attempt 1:
      1. ls({}) -> {"files": ["a"]}
      Expected outcome: There is a.
    """
    lines = [f"Attempt {index}:"]
    for i, rec in enumerate(attempt.calls, start=1):
        args = clip(json.dumps(rec.call.arguments, ensure_ascii=False), max_chars)
        result = clip(json.dumps(rec.response, ensure_ascii=False), max_chars)
        lines.append(f"  {i}. {rec.call.name}({args}) -> {result}")
    if not attempt.calls:
        lines.append("  (no tool calls)")
    if attempt.outcome:
        lines.append(f"  Expected outcome: {clip(attempt.outcome, max_chars)}")
    errors = attempt.errors()
    if errors:
        lines.append(f"  Problems: {'; '.join(errors)}.")
    return "\n".join(lines)


def render_memory(attempts: list[Attempt], max_chars: int = 200, revised: bool = False) -> str:
    """The whole imagination note: a header (:data:`REVISED_HEADER` for a revision after a real
    response the rehearsal did not foresee), each attempt, a closing instruction.

    >>> print(render_memory([Attempt(outcome="Done.")]).splitlines()[1:3])
    ['Attempt 1:', '  (no tool calls)']
    """
    body = "\n".join(render_attempt(i, a, max_chars) for i, a in enumerate(attempts, start=1))
    return f"{REVISED_HEADER if revised else HEADER}\n{body}\n{FOOTER}"


def response_shape(response: JSON) -> str:
    """What a response looks like, as drift changes it: ``error``, an object's sorted keys, or the type.

    >>> response_shape({"b": 1, "a": [2]}), response_shape({"error": "x"}), response_shape([1])
    ('{a,b}', 'error', 'list')
    """
    if is_error(response):
        return "error"
    if isinstance(response, dict):
        return "{" + ",".join(sorted(response)) + "}"
    return type(response).__name__


def unforeseen(attempts: list[Attempt], real: list[CallRecord]) -> list[CallRecord]:
    """The real call records whose response has a shape no attempt rehearsed for a call of the same
    tool (a tool no attempt called foresees nothing, so it is left out: there is nothing to correct).

    >>> from envace.types import ToolCall
    >>> a = [Attempt([CallRecord(ToolCall("ls"), {"files": []})])]
    >>> [r.response for r in unforeseen(a, [CallRecord(ToolCall("ls"), {"files": ["x"]}),
    ...     CallRecord(ToolCall("ls"), {"data": {"files": []}}), CallRecord(ToolCall("cd"), {"error": "no"})])]
    [{'data': {'files': []}}]
    """
    seen: dict[str, set[str]] = {}
    for attempt in attempts:
        for r in attempt.calls:
            seen.setdefault(r.call.name, set()).add(response_shape(r.response))
    return [r for r in real if r.call.name in seen and response_shape(r.response) not in seen[r.call.name]]
