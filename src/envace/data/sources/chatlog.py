"""Any OpenAI-chat log with recorded tool results (FinMCP-Bench records are of this form).

One JSON object per line::

    {"id": "optional", "split": "optional", "tools": [{"type": "function", "function": {...}}],
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "quote", "arguments": "{\\"symbol\\": \\"X\\"}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "{\\"price\\": 1}"}, ...]}

A :class:`~envace.types.Task` per line: the system message is the system prompt, each user message
a user turn, the assistant ``tool_calls`` after a user message that turn's gold, and every call
that got a ``tool`` message (matched by ``tool_call_id``) a :class:`~envace.types.CallRecord` in
``recorded`` (call order) for the Replay responder. Tool outputs are parsed as JSON; scalars and
non-JSON text become ``{"result": ...}``. ``env`` is ``None``. Malformed input raises
``ValueError("<file>:<line>: <field path>: <problem>")``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envace.types import JSON, CallRecord, Task, ToolCall


def _fail(where: str, field: str, problem: str) -> ValueError:
    return ValueError(f"{where}: {field}: {problem}")


def text_of(content: Any, where: str, field: str) -> str:
    """Message content as text: a string, ``None``, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise _fail(where, field, f"expected a string or a list of parts, got {type(content).__name__}")


def tool_output(content: str) -> JSON:
    """A recorded tool output as JSON: objects and arrays as they are, anything else in ``{"result": ...}``.

    >>> tool_output('{"a": 1}'), tool_output("3"), tool_output("plain text")
    ({'a': 1}, {'result': 3}, {'result': 'plain text'})
    """
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        value = content
    return value if isinstance(value, dict | list) else {"result": value}


def parse_tool_call(raw: Any, where: str, field: str) -> tuple[str, ToolCall]:
    """One OpenAI ``tool_calls`` entry as ``(id, ToolCall)``; arguments may be a JSON string or an object."""
    if not isinstance(raw, dict):
        raise _fail(where, field, "expected an object")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise _fail(where, f"{field}.function", "missing")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(where, f"{field}.function.name", "missing")
    args: Any = fn.get("arguments")
    if args is None or args == "":
        args = {}
    elif isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            raise _fail(where, f"{field}.function.arguments", f"not valid JSON: {exc.msg}") from None
    if not isinstance(args, dict):
        raise _fail(where, f"{field}.function.arguments", f"expected a JSON object, got {type(args).__name__}")
    return str(raw.get("id") or ""), ToolCall(name, args)


def parse_tools(raw: Any, where: str) -> list[dict[str, Any]]:
    """The record's ``tools`` (OpenAI nested or flat schemas); each needs a name."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fail(where, "tools", "expected a list")
    for i, tool in enumerate(raw):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _fail(where, f"tools[{i}].function.name", "missing")
    return list(raw)


class _Conversation:
    """Accumulates one record's turns, gold and recorded calls while its messages are read."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.system: list[str] = []
        self.user_turns: list[str] = []
        self.gold: list[list[ToolCall]] = []
        self.pending: dict[str, ToolCall] = {}
        self.answered: dict[str, JSON] = {}
        self.order: list[str] = []
        self.final = ""

    def add(self, i: int, msg: Any) -> None:
        field = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _fail(self.where, field, "expected an object")
        role = msg.get("role")
        content = text_of(msg.get("content"), self.where, f"{field}.content")
        if role == "system":
            self.system.append(content)
        elif role == "user":
            self.user_turns.append(content)
            self.gold.append([])
        elif role == "assistant":
            self._assistant(field, msg, content)
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _fail(self.where, f"{field}.tool_call_id", "missing")
            if call_id not in self.pending or call_id in self.answered:
                raise _fail(self.where, f"{field}.tool_call_id", f"no earlier unanswered call with id {call_id!r}")
            self.answered[call_id] = tool_output(content)
        else:
            raise _fail(self.where, f"{field}.role", f"expected system, user, assistant or tool, got {role!r}")

    def _assistant(self, field: str, msg: dict[str, Any], content: str) -> None:
        calls = msg.get("tool_calls") or []
        if not isinstance(calls, list):
            raise _fail(self.where, f"{field}.tool_calls", "expected a list")
        if calls and not self.gold:
            raise _fail(self.where, f"{field}.tool_calls", "tool calls before any user message")
        for j, raw in enumerate(calls):
            call_id, call = parse_tool_call(raw, self.where, f"{field}.tool_calls[{j}]")
            call_id = call_id or f"_anonymous_{len(self.order)}"
            if call_id in self.pending:
                raise _fail(self.where, f"{field}.tool_calls[{j}].id", f"duplicate id {call_id!r}")
            self.pending[call_id] = call
            self.order.append(call_id)
            self.gold[-1].append(call)
        if content:
            self.final = content

    def recorded(self) -> list[CallRecord]:
        return [CallRecord(self.pending[c], self.answered[c]) for c in self.order if c in self.answered]


def parse_record(record: Any, where: str, default_id: str, benchmark: str = "chatlog") -> Task:
    """One log record as a :class:`Task` (see the module docstring).

    Args:
        record: the decoded JSON object of one line.
        where: ``"<file>:<line>"`` for error messages.
        default_id: the task id when the record has no ``id``.
        benchmark: the :attr:`Task.benchmark` to set (``"finmcp"`` for FinMCP-Bench records).
    """
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise _fail(where, "messages", "missing" if messages is None else "expected a list")
    conv = _Conversation(where)
    for i, msg in enumerate(messages):
        conv.add(i, msg)
    if not conv.user_turns:
        raise _fail(where, "messages", "no user message")
    return Task(
        id=str(record.get("id") or default_id),
        benchmark=benchmark,
        category=str(record.get("category") or ""),
        system_prompt="\n\n".join(conv.system),
        tools=parse_tools(record.get("tools"), where),
        user_turns=conv.user_turns,
        gold=conv.gold,
        recorded=conv.recorded(),
        extra={
            "source": where,
            "final_response": conv.final,
            "unanswered_calls": len(conv.order) - len(conv.answered),
        },
    )


def _files(path: str | Path) -> list[Path]:
    root = Path(path)
    if root.is_dir():
        return sorted(root.glob("*.jsonl"))
    if not root.exists():
        raise ValueError(f"{root}: no such file or folder")
    return [root]


def load_chatlog(split: str = "all", path: str | None = None, benchmark: str = "chatlog", **kw: Any) -> list[Task]:
    """Load every record of a JSONL file (or of every ``*.jsonl`` in a folder).

    Args:
        split: ``all``, or keep only the records whose ``split`` field equals it.
        path: the JSONL file or folder (required: logs are the user's own).
        benchmark: :attr:`Task.benchmark` of the tasks (``"finmcp"`` for FinMCP-Bench).
    """
    if kw:
        raise TypeError(f"load_chatlog: unexpected arguments {sorted(kw)}")
    if not path:
        raise ValueError("load_chatlog: pass path=<a .jsonl file or a folder of them>")
    tasks = []
    for file in _files(path):
        with file.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                where = f"{file.name}:{lineno}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
                if split != "all" and (not isinstance(record, dict) or record.get("split") != split):
                    continue
                tasks.append(parse_record(record, where, f"{file.stem}-{lineno}", benchmark))
    return tasks
