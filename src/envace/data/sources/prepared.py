"""Prepared datasets: tasks (and grounded trajectories) as a typed Hugging Face dataset, and back.

``envace data prepare`` writes a folder that ``datasets.load_from_disk`` reads (the ``save_to_disk``
layout, plus ``prepared.json``: what it was prepared from). Its columns are typed (:data:`FEATURES`),
so a row reads as the chat data it is, in the shape the function-calling ecosystem uses:

* ``id``, ``benchmark``, ``category``, ``system_prompt`` (strings), ``user_turns`` (list of strings);
* ``tools``: one record per tool, ``{name, description, schema}``, ``schema`` the tool's whole JSON
  schema as JSON text (tool schemas differ in shape, which one Arrow type cannot hold);
* ``gold``: per user turn, its calls ``{name, arguments}``; ``tools_added``: ``{turn, tools}``;
  ``recorded``: ``{name, arguments, response}``; ``arguments`` and ``response`` are JSON text (as in
  OpenAI's ``tool_calls``); ``user_sim``, ``env`` and ``extra`` are JSON text (``null`` when absent);
* grounded (``--grounded true``) adds ``messages``: the conversation as OpenAI chat messages,
  ``{role, content, tool_calls: [{type: "function", function: {name, arguments}}], name}``, the
  system message first (it repeats ``system_prompt``); ``calls``: every call with the real response
  it got; ``trajectory_source`` (``grounded``).

:func:`task_row` / :func:`trajectory_row` write a row and :func:`read_row` reads it back: the
:class:`~envace.types.Task` and :class:`~envace.types.Trajectory` equal to the originals. The
``prepared`` source (:func:`load_prepared`, ``{name: prepared, path: <folder>}`` in a config) trains
from such a folder. A folder is untrusted input: every problem is one :class:`RowError`,
``<folder>: row <i>: <field>: <problem>`` (``i`` as in ``dataset[i]``), or a
:class:`~envace.data.sources.records.RecordError` for the folder as a whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

from envace.data.sources.records import RecordError, short
from envace.protocol import strict_json
from envace.types import CallRecord, Message, Task, ToolCall, Trajectory

MANIFEST = "prepared.json"
ROLES = ("system", "user", "assistant", "tool")

_TEXT = datasets.Value("string")
TOOL = {"name": _TEXT, "description": _TEXT, "schema": _TEXT}
CALL = {"name": _TEXT, "arguments": _TEXT}
RECORD = {"name": _TEXT, "arguments": _TEXT, "response": _TEXT}
MESSAGE = {
    "role": _TEXT,
    "content": _TEXT,
    "tool_calls": datasets.List({"type": _TEXT, "function": CALL}),
    "name": _TEXT,
}
#: the columns of every prepared dataset
FEATURES = datasets.Features(
    {
        "id": _TEXT,
        "benchmark": _TEXT,
        "category": _TEXT,
        "system_prompt": _TEXT,
        "tools": datasets.List(TOOL),
        "user_turns": datasets.List(_TEXT),
        "gold": datasets.List(datasets.List(CALL)),
        "tools_added": datasets.List({"turn": datasets.Value("int32"), "tools": datasets.List(TOOL)}),
        "user_sim": _TEXT,
        "env": _TEXT,
        "recorded": datasets.List(RECORD),
        "extra": _TEXT,
    }
)
#: the columns a grounded dataset adds
TRAJECTORY_FEATURES = datasets.Features(
    {"messages": datasets.List(MESSAGE), "calls": datasets.List(RECORD), "trajectory_source": _TEXT}
)


class RowError(RecordError):
    """A bad row of a prepared dataset: ``<folder>: row <i>: <field>: <problem>``."""

    def __init__(self, file: Path | str, row: int, field: str, message: str) -> None:
        ValueError.__init__(self, f"{file}: row {row}: {field}: {message}")
        self.file, self.line, self.field, self.column, self.problem = str(file), row, field, None, message
        self.row = row

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.file, self.row, self.field, self.problem))


def features(grounded: bool) -> datasets.Features:
    """The columns of a prepared dataset, with the trajectory's when ``grounded``."""
    return datasets.Features({**FEATURES, **(TRAJECTORY_FEATURES if grounded else {})})


# --- writing -----------------------------------------------------------------------------------
def dumps(value: Any, task: Task, field: str) -> str:
    """``value`` as JSON text; a value JSON cannot hold exactly is an error naming the task and field."""
    try:
        strict_json.check_value(value)
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"task {task.id!r}: {field}: cannot be written as JSON: {exc}") from None


def _tool_names(schema: Any) -> tuple[str, str]:
    """The name and description of a tool schema, bare (``{name, ...}``) or OpenAI's ``{type, function}``."""
    body = schema.get("function", schema) if isinstance(schema, dict) and "name" not in schema else schema
    body = body if isinstance(body, dict) else {}
    name, description = body.get("name"), body.get("description")
    return (name if isinstance(name, str) else ""), (description if isinstance(description, str) else "")


def _tools(tools: list[Any], task: Task, field: str) -> list[dict[str, str]]:
    out = []
    for i, schema in enumerate(tools):
        name, description = _tool_names(schema)
        out.append({"name": name, "description": description, "schema": dumps(schema, task, f"{field}[{i}]")})
    return out


def _call(call: ToolCall, task: Task, field: str) -> dict[str, str]:
    return {"name": call.name, "arguments": dumps(call.arguments, task, f"{field}.arguments")}


def _records(records: list[CallRecord], task: Task, field: str) -> list[dict[str, str]]:
    return [
        {**_call(r.call, task, f"{field}[{i}]"), "response": dumps(r.response, task, f"{field}[{i}].response")}
        for i, r in enumerate(records)
    ]


def _maybe(value: Any, task: Task, field: str) -> str | None:
    return None if value is None else dumps(value, task, field)


def _encodable(row: dict[str, Any], task: Task) -> dict[str, Any]:
    """``row``, once every string in it is one Arrow can store (UTF-8: no lone surrogate)."""
    try:
        strict_json.check_value(row)
    except ValueError as exc:
        raise ValueError(f"task {task.id!r}: cannot be written: {exc}") from None
    return row


def task_row(task: Task) -> dict[str, Any]:
    """The columns of :data:`FEATURES` for ``task``."""
    for turn in task.tools_added:
        if not turn.isdigit() or str(int(turn)) != turn:
            raise ValueError(f"task {task.id!r}: tools_added: key {turn!r} is not a turn number")
    return _encodable(
        {
            "id": task.id,
            "benchmark": task.benchmark,
            "category": task.category,
            "system_prompt": task.system_prompt,
            "tools": _tools(task.tools, task, "tools"),
            "user_turns": list(task.user_turns),
            "gold": [
                [_call(c, task, f"gold[{t}][{i}]") for i, c in enumerate(turn)] for t, turn in enumerate(task.gold)
            ],
            "tools_added": [
                {"turn": int(k), "tools": _tools(v, task, f"tools_added[{k}]")} for k, v in task.tools_added.items()
            ],
            "user_sim": _maybe(task.user_sim, task, "user_sim"),
            "env": _maybe(task.env, task, "env"),
            "recorded": _records(task.recorded, task, "recorded"),
            "extra": dumps(task.extra, task, "extra"),
        },
        task,
    )


def message_record(m: Message, task: Task, field: str) -> dict[str, Any]:
    """One OpenAI-style chat message (``tool_calls`` with JSON-text ``arguments``)."""
    calls = [
        {"type": "function", "function": _call(c, task, f"{field}.tool_calls[{i}]")} for i, c in enumerate(m.tool_calls)
    ]
    return {"role": m.role, "content": m.content, "tool_calls": calls, "name": m.name}


def trajectory_row(traj: Trajectory, task: Task) -> dict[str, Any]:
    """The columns of :data:`TRAJECTORY_FEATURES` for ``traj``, a trajectory of ``task``."""
    if traj.task != task:
        raise ValueError(f"task {task.id!r}: its trajectory is of another task ({traj.task.id!r})")
    system = Message("system", task.system_prompt)
    row = {
        "messages": [message_record(m, task, f"messages[{i}]") for i, m in enumerate([system, *traj.messages])],
        "calls": _records(traj.calls, task, "calls"),
        "trajectory_source": traj.source,
    }
    return _encodable(row, task)


# --- reading -----------------------------------------------------------------------------------
class _Row:
    """Typed access to one row; every problem a :class:`RowError` naming the field."""

    def __init__(self, folder: str, index: int, row: dict[str, Any]) -> None:
        self.folder, self.index, self.row = folder, index, row

    def error(self, field: str, message: str) -> RowError:
        return RowError(self.folder, self.index, field, message)

    def get(self, field: str) -> Any:
        if field not in self.row:
            raise self.error(field, "missing column")
        return self.row[field]

    def check(self, value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
        if not isinstance(value, kind):
            raise self.error(field, f"expected {what}, got {short(value)}")
        return value

    def text(self, value: Any, field: str) -> str:
        return self.check(value, str, field, "a string")  # type: ignore[no-any-return]

    def items(self, value: Any, field: str) -> list[Any]:
        return self.check(value, list, field, "a list")  # type: ignore[no-any-return]

    def json(self, value: Any, field: str, kind: type | None = None) -> Any:
        try:
            parsed = strict_json.loads(self.text(value, field))
        except strict_json.JSONRejected as exc:
            raise self.error(field, f"not valid JSON: {exc}") from None
        if kind is dict and not isinstance(parsed, dict):
            raise self.error(field, f"expected a JSON object, got {short(parsed)}")
        return parsed

    def call(self, value: Any, field: str) -> ToolCall:
        record = self.check(value, dict, field, "a call {name, arguments}")
        name = self.text(record.get("name"), f"{field}.name")
        return ToolCall(name, self.json(record.get("arguments"), f"{field}.arguments", dict))

    def records(self, value: Any, field: str) -> list[CallRecord]:
        out = []
        for i, record in enumerate(self.items(value, field)):
            call = self.call(record, f"{field}[{i}]")
            out.append(CallRecord(call, self.json(record.get("response"), f"{field}[{i}].response")))
        return out

    def tools(self, value: Any, field: str) -> list[Any]:
        out = []
        for i, record in enumerate(self.items(value, field)):
            at = f"{field}[{i}]"
            self.check(record, dict, at, "a tool {name, description, schema}")
            schema = self.json(record.get("schema"), f"{at}.schema", dict)
            for key, derived in zip(("name", "description"), _tool_names(schema), strict=True):
                if record.get(key) != derived:
                    found = f"{short(record.get(key))} is not the {key} in {at}.schema ({short(derived)})"
                    raise self.error(f"{at}.{key}", f"{found}: edit both")
            out.append(schema)
        return out

    def maybe_json(self, value: Any, field: str) -> Any:
        return None if value is None else self.json(value, field, dict)

    def message(self, value: Any, field: str) -> Message:
        record = self.check(value, dict, field, "a message {role, content, tool_calls, name}")
        role = record.get("role")
        if role not in ROLES:
            raise self.error(f"{field}.role", f"{short(role)} is not one of {', '.join(ROLES)}")
        calls = []
        for i, call in enumerate(self.items(record.get("tool_calls") or [], f"{field}.tool_calls")):
            at = f"{field}.tool_calls[{i}]"
            self.check(call, dict, at, "a tool call {type, function}")
            if call.get("type") != "function":
                raise self.error(f"{at}.type", f"expected 'function', got {short(call.get('type'))}")
            calls.append(self.call(call.get("function"), f"{at}.function"))
        name = record.get("name")
        if name is not None:
            self.text(name, f"{field}.name")
        return Message(role, self.text(record.get("content") or "", f"{field}.content"), calls, name)


def read_task(r: _Row) -> Task:
    gold = [
        [r.call(c, f"gold[{t}][{i}]") for i, c in enumerate(r.items(turn, f"gold[{t}]"))]
        for t, turn in enumerate(r.items(r.get("gold"), "gold"))
    ]
    added: dict[str, list[Any]] = {}
    for i, entry in enumerate(r.items(r.get("tools_added"), "tools_added")):
        r.check(entry, dict, f"tools_added[{i}]", "a record {turn, tools}")
        turn = r.check(entry.get("turn"), int, f"tools_added[{i}].turn", "a turn number")
        if turn < 0 or str(turn) in added:
            raise r.error(f"tools_added[{i}].turn", f"{turn} is negative or repeats an earlier turn")
        added[str(turn)] = r.tools(entry.get("tools"), f"tools_added[{i}].tools")
    task_id = r.text(r.get("id"), "id")
    if not task_id:
        raise r.error("id", "empty")
    return Task(
        id=task_id,
        benchmark=r.text(r.get("benchmark"), "benchmark"),
        category=r.text(r.get("category"), "category"),
        system_prompt=r.text(r.get("system_prompt"), "system_prompt"),
        tools=r.tools(r.get("tools"), "tools"),
        user_turns=[r.text(u, f"user_turns[{i}]") for i, u in enumerate(r.items(r.get("user_turns"), "user_turns"))],
        gold=gold,
        tools_added=added,
        user_sim=r.maybe_json(r.get("user_sim"), "user_sim"),
        env=r.maybe_json(r.get("env"), "env"),
        recorded=r.records(r.get("recorded"), "recorded"),
        extra=r.json(r.get("extra"), "extra", dict),
    )


def read_trajectory(r: _Row, task: Task) -> Trajectory:
    messages = [r.message(m, f"messages[{i}]") for i, m in enumerate(r.items(r.get("messages"), "messages"))]
    if not messages or messages[0].role != "system" or messages[0].content != task.system_prompt:
        raise r.error("messages[0]", "must be the system message, repeating system_prompt")
    source = r.text(r.get("trajectory_source"), "trajectory_source")
    return Trajectory(task, messages[1:], r.records(r.get("calls"), "calls"), source)


def read_row(folder: str, index: int, row: dict[str, Any]) -> tuple[Task, Trajectory | None]:
    """The task of one row and, when the row has ``messages``, its trajectory."""
    r = _Row(folder, index, row)
    task = read_task(r)
    return task, read_trajectory(r, task) if "messages" in row else None


# --- the source --------------------------------------------------------------------------------
def open_folder(path: str | Path) -> tuple[datasets.Dataset, dict[str, Any]]:
    """The dataset and manifest of a prepared folder; a :class:`RecordError` for a folder that is not one."""
    folder = Path(path)
    if not folder.is_dir():
        raise RecordError(folder, None, None, "no such folder (write one with `envace data prepare`)")
    try:
        dataset = datasets.load_from_disk(str(folder))
    except Exception as exc:  # not a dataset folder, a damaged arrow file, a state.json edited by hand
        raise RecordError(
            folder, None, None, f"not a dataset folder ({type(exc).__name__}: {short(str(exc), 160)})"
        ) from None
    if not isinstance(dataset, datasets.Dataset):
        raise RecordError(folder, None, None, "holds a DatasetDict, not the one dataset `envace data prepare` writes")
    missing = [c for c in FEATURES if c not in dataset.column_names]
    if missing:
        raise RecordError(folder, None, None, f"missing column(s) {', '.join(missing)}: not a prepared dataset")
    manifest: dict[str, Any] = {}
    if (folder / MANIFEST).exists():
        try:
            manifest = strict_json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (strict_json.JSONRejected, UnicodeDecodeError) as exc:
            raise RecordError(folder / MANIFEST, None, None, f"not valid JSON: {exc}") from None
    return dataset, manifest if isinstance(manifest, dict) else {}


def read_prepared(path: str | Path, split: str = "all") -> list[tuple[Task, Trajectory | None]]:
    """Every row of a prepared folder as ``(task, trajectory or None)``; ids must be unique.

    Args:
        path: the folder.
        split: ``all``, or the split the folder was prepared from (``prepared.json``); another split
            is an error, so that a test split never trains by a config's default ``split: train``.
    """
    dataset, manifest = open_folder(path)
    made = manifest.get("split")
    if split != "all" and made is not None and split != made:
        raise ValueError(f"{path}: prepared from split {made!r}, asked for {split!r} (use split: {made} or all)")
    if len(dataset) == 0:
        raise RecordError(path, None, None, "no rows: an empty dataset is never a training set")
    out: list[tuple[Task, Trajectory | None]] = []
    seen: dict[str, int] = {}
    for i, row in enumerate(dataset):
        task, traj = read_row(str(path), i, row)
        if task.id in seen:
            raise RowError(path, i, "id", f"{task.id!r} repeats row {seen[task.id]}")
        seen[task.id] = i
        out.append((task, traj))
    return out


def load_prepared(split: str = "all", path: str | None = None) -> list[Task]:
    """The ``prepared`` source: the tasks of a folder ``envace data prepare`` wrote (``split``, ``path``:
    as :func:`read_prepared`)."""
    if path is None:
        raise ValueError("source 'prepared' needs path: the folder `envace data prepare --out` wrote")
    return [task for task, _ in read_prepared(path, split)]
