"""Canonical records shared by data sources, environments, the rollout and the rewards.

Everything here is plain data: JSON-serialisable through :func:`to_json` / ``from_json`` so that a
``datasets`` dataset can hold it, and free of tensors, models and environments.

A tool schema is an OpenAI-style function description::

    {"name": "cd", "description": "Change directory.", "parameters": {<JSON Schema object>}}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Role = Literal["context", "act", "rehearse"]
ROLES: tuple[Role, ...] = ("context", "act", "rehearse")
ROLE_IDS: dict[str, int] = {"context": 0, "act": 1, "rehearse": 2}

ToolSchema = dict[str, Any]
JSON = Any
#: the limits that can end an episode, as ``Episode.flags`` and the result files record them
TRUNCATED, MAX_STEPS, MAX_EPISODE_TOKENS = "truncated", "max_steps", "max_episode_tokens"
END_FLAGS = (TRUNCATED, MAX_STEPS, MAX_EPISODE_TOKENS)


@dataclass(frozen=True)
class ToolCall:
    """One call a model asked for: a tool name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(name=d["name"], arguments=dict(d.get("arguments") or {}))

    def __hash__(self) -> int:  # arguments is a dict; hash its canonical JSON
        return hash((self.name, json.dumps(self.arguments, sort_keys=True, default=str)))


def error_observation(code: str, message: str) -> dict[str, Any]:
    """The structured error every failure turns into, never an exception.

    >>> error_observation("UNKNOWN_TOOL", "no tool named 'x'")
    {'error': {'code': 'UNKNOWN_TOOL', 'message': "no tool named 'x'"}}
    """
    return {"error": {"code": code, "message": message}}


def is_error(response: JSON) -> bool:
    """True for a structured error observation (ours, or an environment's ``{"error": ...}``).

    >>> is_error({"error": {"code": "X", "message": "m"}}), is_error({"result": 1}), is_error([1])
    (True, False, False)
    """
    return isinstance(response, dict) and "error" in response


@dataclass
class FidelityPair:
    """A rehearsed response and the real one, for the same call in the same state."""

    call: ToolCall
    rehearsed: JSON
    real: JSON
    benchmark: str


@dataclass
class CallRecord:
    """A call and the response it got (real, recorded or rehearsed)."""

    call: ToolCall
    response: JSON

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.call.to_dict(), "response": self.response}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CallRecord:
        return cls(call=ToolCall.from_dict(d["call"]), response=d["response"])


@dataclass
class Message:
    """One chat message. ``tool_calls`` only on assistant turns, ``name`` only on tool turns."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.name is not None:
            d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=[ToolCall.from_dict(c) for c in d.get("tool_calls") or []],
            name=d.get("name"),
        )


@dataclass
class Task:
    """One benchmark item in canonical form.

    Attributes:
        id: unique within its benchmark.
        benchmark: ``bfcl``, ``tau2``, ``vitabench``, ``finmcp``, ``chatlog``, ...
        category: the benchmark's own category (``multi_turn_base``, ``airline``, ...).
        system_prompt: text of the system turn, without the tool block.
        tools: tool schemas available from the first turn.
        user_turns: scripted user messages, one per turn (empty when a user simulator drives).
        gold: gold calls per user turn (``len(gold) == len(user_turns)`` when known, else empty).
        tools_added: tools that appear at a given user turn (BFCL ``missed_function``), keyed by
            the turn index as a string (JSON object keys are strings).
        user_sim: instructions for a user simulator (tau2, VitaBench), or ``None``.
        env: how to build the real environment (``{"kind": "bfcl", ...}``), or ``None``.
        recorded: recorded call/response pairs (Replay responder; FinMCP-style logs).
        extra: benchmark-specific fields the scorers need (possible answers, outputs, ...).
    """

    id: str
    benchmark: str
    category: str = ""
    system_prompt: str = ""
    tools: list[ToolSchema] = field(default_factory=list)
    user_turns: list[str] = field(default_factory=list)
    gold: list[list[ToolCall]] = field(default_factory=list)
    tools_added: dict[str, list[ToolSchema]] = field(default_factory=dict)
    user_sim: dict[str, Any] | None = None
    env: dict[str, Any] | None = None
    recorded: list[CallRecord] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def tools_at(self, turn: int) -> list[ToolSchema]:
        """Tools visible at user turn ``turn`` (the initial ones plus any added so far)."""
        tools = list(self.tools)
        for k in sorted(self.tools_added, key=int):
            if int(k) <= turn:
                tools.extend(self.tools_added[k])
        return tools

    def first_turns(self, k: int | None) -> Task:
        """The task cut to its first ``k`` user turns (all of them for ``None``), every per-turn field
        with them, so that nothing of a dropped turn leaks into the rollout, the warm start or a scorer:
        ``gold``, ``tools_added`` at turns ``>= k``, BFCL's per-turn ``extra["ground_truth"]`` (when
        present, one entry per turn), the ``recorded`` responses of the dropped turns' calls, and
        ``extra["final_response"]`` (it answered the last turn). ``extra["truncated_from"]`` keeps the
        original turn count. The task itself is not changed; it is returned as is when nothing is cut.

        >>> t = Task("t", "x", user_turns=["a", "b"], gold=[[ToolCall("f")], [ToolCall("g")]], tools_added={"1": []})
        >>> c = t.first_turns(1)
        >>> c.user_turns, [[x.name for x in turn] for turn in c.gold], c.tools_added, c.extra["truncated_from"]
        (['a'], [['f']], {}, 2)
        >>> t.first_turns(2) is t and t.first_turns(None) is t
        True
        """
        if k is None or len(self.user_turns) <= k:
            return self
        gold = self.gold[:k]
        extra = dict(self.extra, truncated_from=len(self.user_turns))
        truth = extra.get("ground_truth")
        if isinstance(truth, list) and len(truth) == len(self.user_turns):  # per turn (BFCL), not per item
            extra["ground_truth"] = truth[:k]
        extra.pop("final_response", None)
        return replace(
            self,
            user_turns=self.user_turns[:k],
            gold=gold,
            tools_added={t: v for t, v in self.tools_added.items() if int(t) < k},
            recorded=_records_before(self.recorded, [c for turn in gold for c in turn]),
            extra=extra,
        )

    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps(d, default=str)

    @classmethod
    def from_json(cls, s: str | dict[str, Any]) -> Task:
        d = json.loads(s) if isinstance(s, str) else dict(s)
        d["gold"] = [[ToolCall.from_dict(c) for c in turn] for turn in d.get("gold") or []]
        d["recorded"] = [CallRecord.from_dict(r) for r in d.get("recorded") or []]
        return cls(**d)


def _records_before(recorded: list[CallRecord], calls: list[ToolCall]) -> list[CallRecord]:
    """The leading records that answer ``calls`` in order (records hold only answered calls)."""
    i = 0
    for call in calls:
        if i < len(recorded) and recorded[i].call == call:
            i += 1
    return recorded[:i]


@dataclass
class Trajectory:
    """A finished conversation for a task: messages from the first user turn on.

    Grounded trajectories (gold calls replayed in the real environment) and recorded logs share
    this form; ``calls`` lists every call with the response it got, in order.
    """

    task: Task
    messages: list[Message]
    calls: list[CallRecord] = field(default_factory=list)
    source: str = "grounded"

    def to_json(self) -> str:
        return json.dumps(
            {
                "task": json.loads(self.task.to_json()),
                "messages": [m.to_dict() for m in self.messages],
                "calls": [c.to_dict() for c in self.calls],
                "source": self.source,
            },
            default=str,
        )

    @classmethod
    def from_json(cls, s: str | dict[str, Any]) -> Trajectory:
        d = json.loads(s) if isinstance(s, str) else s
        return cls(
            task=Task.from_json(d["task"]),
            messages=[Message.from_dict(m) for m in d["messages"]],
            calls=[CallRecord.from_dict(c) for c in d.get("calls") or []],
            source=d.get("source", "grounded"),
        )


class UsageError(ValueError):
    """Bad input on the command line or in a config: ``message`` says what is wrong, ``hint`` how to
    see what is accepted (printed as a second line, when given). Raised wherever input is checked (a
    config, a plug-in, a grounding that fails); ``envace.cli.main`` prints it as one or two lines, exit 2."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message, self.hint = message, hint

    def lines(self, prog: str) -> str:
        """The one or two lines :func:`envace.cli.main` prints on stderr."""
        first = f"{prog}: error: {' '.join(self.message.split())}"
        return first if self.hint is None else f"{first}\n{prog}: {self.hint}"
