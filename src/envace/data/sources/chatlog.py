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
non-JSON text become ``{"result": ...}``. ``env`` is ``None``.

Log files are untrusted: malformed input (a bad byte, broken or unusable JSON, a missing field, a
call to a tool the record does not list, a file without records, a call whose arguments break its
tool's schema and that the log does not show refused: :mod:`envace.data.sources.schema`) raises one
:class:`~envace.data.sources.records.RecordError`, ``<file>:<line>: <field path>: <problem>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.data.sources.records import RecordError, read_jsonl, short, split_position
from envace.data.sources.schema import argument_error, refused
from envace.protocol import strict_json
from envace.protocol.strict_json import JSONRejected
from envace.types import JSON, CallRecord, Task, ToolCall


@dataclass(frozen=True)
class Line:
    """Where a record was read (file, 1-based line): every error raised while reading it names both."""

    file: Path
    number: int

    def error(self, field: str | None, problem: str) -> RecordError:
        return RecordError(self.file, self.number, field, problem)

    @property
    def source(self) -> str:
        """``<file name>:<line>``, kept in :attr:`Task.extra` (no machine-specific folder)."""
        return f"{self.file.name}:{self.number}"


def _part_text(part: Any, at: Line, field: str) -> str:
    if not isinstance(part, dict):
        raise at.error(field, f"expected a part object, got {type(part).__name__}")
    if part.get("type") != "text":  # an image or audio part would be lost in a text-only task
        raise at.error(f"{field}.type", f"only text parts are supported, got {short(part.get('type'))}")
    if not isinstance(part.get("text"), str):
        raise at.error(f"{field}.text", "expected a string")
    return str(part["text"])


def text_of(content: Any, at: Line, field: str) -> str:
    """Message content as text: a string, ``None``, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p, at, f"{field}[{j}]") for j, p in enumerate(content))
    raise at.error(field, f"expected a string or a list of parts, got {type(content).__name__}")


def tool_output(content: str) -> JSON:
    """A recorded tool output as JSON: objects and arrays as they are, anything else in ``{"result": ...}``.

    Text that is not usable JSON (plain text, ``NaN``, a 5,000-digit number) is kept as text.

    >>> tool_output('{"a": 1}'), tool_output("3"), tool_output("plain text"), tool_output("NaN")
    ({'a': 1}, {'result': 3}, {'result': 'plain text'}, {'result': 'NaN'})
    """
    try:
        value = strict_json.loads(content)
    except JSONRejected:
        value = content
    return value if isinstance(value, dict | list) else {"result": value}


def _arguments(args: Any, at: Line, field: str) -> dict[str, Any]:
    """A call's arguments: a JSON object, or a string holding one (OpenAI's form); empty means none."""
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            args = strict_json.loads(args)
        except JSONRejected as exc:
            message, _, column = split_position(str(exc))
            where = f" (column {column})" if column is not None else ""
            what = "not valid JSON" if exc.kind == "decode" else "unusable JSON value"
            raise at.error(field, f"{what}: {message}{where}") from None
    if not isinstance(args, dict):
        raise at.error(field, f"expected a JSON object, got {type(args).__name__}")
    return args


def parse_tool_call(raw: Any, at: Line, field: str) -> tuple[str, ToolCall]:
    """One OpenAI ``tool_calls`` entry as ``(id, ToolCall)``; arguments may be a JSON string or an object."""
    if not isinstance(raw, dict):
        raise at.error(field, "expected an object")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise at.error(f"{field}.function", "missing" if fn is None else "expected an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise at.error(f"{field}.function.name", "missing")
    call_id = raw.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise at.error(f"{field}.id", f"expected a string, got {type(call_id).__name__}")
    return call_id or "", ToolCall(name, _arguments(fn.get("arguments"), at, f"{field}.function.arguments"))


def parse_tools(raw: Any, at: Line) -> list[dict[str, Any]]:
    """The record's ``tools`` (OpenAI nested or flat schemas); each needs a name."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise at.error("tools", "expected a list")
    for i, tool in enumerate(raw):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise at.error(f"tools[{i}].function.name", "missing")
    return list(raw)


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    """The names of :func:`parse_tools`' schemas, in order."""
    return [str(t.get("function", t)["name"]) for t in tools]


def _listing(names: list[str], most: int = 5) -> str:
    """``'a', 'b', ... (9 in all)``: the tools a record lists, short enough for one line."""
    shown = ", ".join(short(n, 30) for n in names[:most])
    return shown if len(names) <= most else f"{shown}, ... ({len(names)} in all)"


class _Conversation:
    """Accumulates one record's turns, gold and recorded calls while its messages are read."""

    def __init__(self, at: Line, tools: list[str]) -> None:
        self.at = at
        self.tools = tools
        self.system: list[str] = []
        self.user_turns: list[str] = []
        self.gold: list[list[ToolCall]] = []
        self.pending: dict[str, ToolCall] = {}
        self.fields: dict[str, str] = {}  # call id -> ``messages[i].tool_calls[j]``
        self.answered: dict[str, JSON] = {}
        self.order: list[str] = []
        self.final = ""

    def add(self, i: int, msg: Any) -> None:
        field = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise self.at.error(field, "expected an object")
        role = msg.get("role")
        content = text_of(msg.get("content"), self.at, f"{field}.content")
        if role == "system":
            self.system.append(content)
        elif role == "user":
            self.user_turns.append(content)
            self.gold.append([])
        elif role == "assistant":
            self._assistant(field, msg, content)
        elif role == "tool":
            self._tool(field, msg, content)
        else:
            raise self.at.error(f"{field}.role", f"expected system, user, assistant or tool, got {short(role)}")

    def _assistant(self, field: str, msg: dict[str, Any], content: str) -> None:
        calls = msg.get("tool_calls") or []
        if not isinstance(calls, list):
            raise self.at.error(f"{field}.tool_calls", "expected a list")
        if calls and not self.gold:
            raise self.at.error(f"{field}.tool_calls", "tool calls before any user message")
        for j, raw in enumerate(calls):
            call_id, call = parse_tool_call(raw, self.at, f"{field}.tool_calls[{j}]")
            self._check_name(call.name, f"{field}.tool_calls[{j}].function.name")
            call_id = call_id or f"_anonymous_{len(self.order)}"
            if call_id in self.pending:
                raise self.at.error(f"{field}.tool_calls[{j}].id", f"duplicate id {short(call_id)}")
            self.pending[call_id] = call
            self.fields[call_id] = f"{field}.tool_calls[{j}]"
            self.order.append(call_id)
            self.gold[-1].append(call)
        if content:
            self.final = content

    def _check_name(self, name: str, field: str) -> None:
        """A call must name one of the record's tools: gold that calls no listed tool cannot be scored."""
        if name not in self.tools:
            listed = f"the record's tools are {_listing(self.tools)}" if self.tools else "the record lists no tools"
            raise self.at.error(field, f"{short(name)} is not a listed tool; {listed}")

    def _tool(self, field: str, msg: dict[str, Any], content: str) -> None:
        call_id = msg.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise self.at.error(f"{field}.tool_call_id", "missing")
        if call_id not in self.pending or call_id in self.answered:
            raise self.at.error(f"{field}.tool_call_id", f"no earlier unanswered call with id {short(call_id)}")
        self.answered[call_id] = tool_output(content)

    def recorded(self) -> list[CallRecord]:
        return [CallRecord(self.pending[c], self.answered[c]) for c in self.order if c in self.answered]

    def drop_schema_breaks(self, tools: list[dict[str, Any]]) -> int:
        """Apply :mod:`envace.data.sources.schema`'s rule: a call whose arguments break its tool's schema
        stays only as a recorded, error-answered call (out of ``gold``), or refuses the record; the
        number left out of ``gold``."""
        dropped = 0
        for call_id in self.order:
            call = self.pending[call_id]
            found = argument_error(call, tools)
            if found is None:
                continue
            path, why = found
            if call_id not in self.answered or not refused(self.answered[call_id]):
                answer = "unanswered" if call_id not in self.answered else "answered as a success"
                raise self.at.error(f"{self.fields[call_id]}.function.arguments{path}",
                                    f"{why} ({answer}: a call that breaks its tool's schema is kept only "
                                    "when the log shows the tool refused it)")  # fmt: skip
            turn = next(t for t, calls in enumerate(self.gold) if any(c is call for c in calls))
            self.gold[turn] = [c for c in self.gold[turn] if c is not call]
            dropped += 1
        return dropped


def _optional(record: dict[str, Any], key: str, kind: type | tuple[type, ...], at: Line) -> Any:
    """``record[key]`` when present and of ``kind`` (``None`` when absent); else an error naming it."""
    value = record.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise at.error(key, f"expected {' or '.join(k.__name__ for k in _tuple(kind))}, got {type(value).__name__}")
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def parse_record(record: Any, at: Line, default_id: str, benchmark: str = "chatlog") -> Task:
    """One log record as a :class:`Task` (see the module docstring).

    Args:
        record: the decoded JSON value of one line.
        at: the file and line it was read from, for error messages.
        default_id: the task id when the record has no ``id``.
        benchmark: the :attr:`Task.benchmark` to set (``"finmcp"`` for FinMCP-Bench records).
    """
    if not isinstance(record, dict):
        raise at.error(None, f"expected a JSON object, got {type(record).__name__}")
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise at.error("messages", "missing" if messages is None else "expected a list")
    record_id = _optional(record, "id", (str, int), at)
    tools = parse_tools(record.get("tools"), at)
    conv = _Conversation(at, tool_names(tools))
    for i, msg in enumerate(messages):
        conv.add(i, msg)
    if not conv.user_turns:
        raise at.error("messages", "no user message")
    refused_calls = conv.drop_schema_breaks(tools)
    return Task(
        id=default_id if record_id in (None, "") else str(record_id),
        benchmark=benchmark,
        category=_optional(record, "category", str, at) or "",
        system_prompt="\n\n".join(conv.system),
        tools=tools,
        user_turns=conv.user_turns,
        gold=conv.gold,
        recorded=conv.recorded(),
        extra={
            "source": at.source,
            "final_response": conv.final,
            "unanswered_calls": len(conv.order) - len(conv.answered),
            "refused_calls": refused_calls,
        },
    )


def _files(path: str | Path) -> list[Path]:
    root = Path(path)
    if root.is_dir():
        files = sorted(root.glob("*.jsonl"))
        if not files:
            raise RecordError(root, None, None, "no *.jsonl files in this folder")
        return files
    if not root.exists():
        raise RecordError(root, None, None, "no such file or folder")
    return [root]


def read_records(file: Path, split: str, benchmark: str) -> list[Task]:
    """The tasks of one JSONL file, those of ``split`` only unless it is ``all``.

    Every line is checked, also those another split's filter drops: a broken line is never skipped
    silently.
    """
    tasks = []
    for n, record in read_jsonl(file):
        at = Line(file, n)
        task = parse_record(record, at, f"{file.stem}-{n}", benchmark)
        record_split = _optional(record, "split", str, at)
        if split in ("all", record_split):
            tasks.append(task)
    return tasks


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
    tasks = [t for file in _files(path) for t in read_records(file, split, benchmark)]
    if not tasks:  # every file holds records (read_jsonl): the split filter kept none
        raise RecordError(path, None, None, f"no record has split {short(split)}")
    return tasks
