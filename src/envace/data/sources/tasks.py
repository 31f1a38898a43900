"""Your own tasks (source ``tasks``): a JSON-lines file, a folder of them, or a ``datasets`` folder.

One task per row (docs/own-tools.md)::

    {"id": "shop-0007",                                   # optional; default <file stem>-<line>
     "split": "train",                                    # optional; what split= selects
     "user_turns": ["Order two blue mugs, then tell me the order's status."],   # a TRL-shaped class: may be
                                                          # left out: reset(**metadata) returns it
     "gold": [[{"name": "place_order", "arguments": {"sku": "MUG-BLUE", "quantity": 2}},
               {"name": "order_status", "arguments": {"order_id": "A1001"}}]],   # optional, per user turn
     "tools": [...],                                      # optional; else the environment's (tools/list)
     "system_prompt": "You are the shop's assistant.",    # optional
     "metadata": {"category": "order"}}                   # optional; kept in task.extra["metadata"]

``path`` is a ``.jsonl`` file (rows filtered by their ``split`` field), a folder holding
``<split>.jsonl`` files (``all``: every one), or a folder ``datasets.save_to_disk`` wrote (a
``DatasetDict``'s split, or one dataset filtered by ``split``). Options: ``env`` — the real
environment of every task (``{"kind": "mcp", "server": {...}}`` or ``{"kind": "python", ...}``: the
tools come from it when a row has none, listed once per load); ``reward`` — the reward of every task
(a registered name, ``gold-calls``, or ``package.module:function``); ``benchmark``; ``system_prompt``.
Every problem is a :class:`~envace.data.sources.records.RecordError` naming file, line and field;
a tool schema a call could never be checked against (not a JSON Schema, a ``$ref`` to a remote
document) is one too, found at load (:func:`schema_problem`), not when the model first calls it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from envace.data.sources.records import RecordError, read_jsonl, short
from envace.envs.mcp import list_server_tools
from envace.envs.pytools import first_message, python_tools
from envace.types import Task, ToolCall, ToolSchema

FIELDS = ("id", "split", "user_turns", "gold", "tools", "system_prompt", "metadata")


def env_tools(env: dict[str, Any]) -> list[ToolSchema]:
    """The tool block of the environment ``env`` names (an MCP server's ``tools/list``, a Python tool set's)."""
    kind = env.get("kind") if isinstance(env, dict) else None
    if kind == "mcp":
        return list_server_tools(env.get("server") or {})
    if kind == "python":
        return python_tools(env)
    raise ValueError(f"env: kind must be 'mcp' or 'python' for the tasks source, got {short(kind)}")


def schema_problem(tool: ToolSchema) -> str | None:
    """Why a call to ``tool`` could never be checked against its ``parameters``, or ``None``.

    >>> schema_problem({"name": "f", "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}},
    ...                 "$defs": {"X": {"type": "array", "items": {"type": "string"}}}}}) is None
    True
    >>> schema_problem({"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": 3}}}})[:40]
    "tool 'f': parameters are not a JSON Sche"
    >>> schema_problem({"name": "f", "parameters": {"properties": {"x": {"$ref": "https://x.org/s.json"}}}})
    "tool 'f': $ref 'https://x.org/s.json' is remote: only refs inside the schema (#/...) resolve"
    """
    import jsonschema

    name, params = tool.get("name"), tool.get("parameters", {"type": "object"})
    if not isinstance(params, dict):
        return f"tool {name!r}: parameters must be a JSON Schema object, got {short(params)}"
    stack: list[Any] = [params]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
                return f"tool {name!r}: $ref {short(ref)} is remote: only refs inside the schema (#/...) resolve"
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    try:
        jsonschema.validators.validator_for(params, default=jsonschema.Draft7Validator).check_schema(params)
    except jsonschema.exceptions.SchemaError as exc:
        return f"tool {name!r}: parameters are not a JSON Schema ({exc.message[:200]})"
    return None


@functools.lru_cache(maxsize=1024)
def _schema_problem(tool_json: str) -> str | None:
    return schema_problem(json.loads(tool_json))


def _calls(raw: Any, file: Path, line: int, turn: int) -> list[ToolCall]:
    field = f"gold[{turn}]"
    if not isinstance(raw, list):
        raise RecordError(file, line, field, f"must be a list of calls, got {short(raw)}")
    calls = []
    for i, call in enumerate(raw):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise RecordError(
                file, line, f"{field}[{i}]", f"a call is {{'name': str, 'arguments': {{}}}}, got {short(call)}"
            )
        args = call.get("arguments", {})
        if not isinstance(args, dict):
            raise RecordError(file, line, f"{field}[{i}].arguments", f"must be an object, got {short(args)}")
        calls.append(ToolCall(call["name"], args))
    return calls


def _turns(row: dict[str, Any], file: Path, line: int, env: Any) -> list[str]:
    turns = row.get("user_turns")
    if turns is None and isinstance(env, dict) and env.get("kind") == "python" and env.get("class"):
        message = first_message(env, row.get("metadata") or {})  # TRL's shape: reset(**row) gives the prompt
        turns = [message] if message else None
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise RecordError(
            file, line, "user_turns", f"must be a non-empty list of non-empty strings, got {short(turns)}"
        )
    return turns


def _tools(row: dict[str, Any], file: Path, line: int, tools: list[ToolSchema] | None) -> list[ToolSchema]:
    listed = row.get("tools")
    if listed is None:
        if tools is None:
            raise RecordError(file, line, "tools", "no tools in the row and no env option to list them from")
        return list(tools)
    if not isinstance(listed, list) or not all(isinstance(t, dict) and "name" in t for t in listed):
        raise RecordError(file, line, "tools", f"must be a list of tool schemas with a 'name', got {short(listed)}")
    for i, tool in enumerate(listed):
        problem = _schema_problem(json.dumps(tool, sort_keys=True))  # rows repeat their tools: checked once
        if problem is not None:
            raise RecordError(file, line, f"tools[{i}]", problem)
    return listed


def _gold(row: dict[str, Any], file: Path, line: int, turns: int, names: set[str]) -> list[list[ToolCall]]:
    raw = row.get("gold", [])
    if not isinstance(raw, list) or (raw and len(raw) != turns):
        raise RecordError(file, line, "gold", f"must hold one list of calls per user turn ({turns}), got {short(raw)}")
    gold = [_calls(g, file, line, i) for i, g in enumerate(raw)]
    for i, turn in enumerate(gold):
        for call in turn:
            if call.name not in names:
                raise RecordError(file, line, f"gold[{i}]", f"calls {call.name!r}, which no listed tool is")
    return gold


def parse_row(row: Any, file: Path, line: int, options: dict[str, Any], tools: list[ToolSchema] | None) -> Task:
    """One row as a :class:`Task` (see the module docstring); ``tools``: the environment's, when known."""
    if not isinstance(row, dict):
        raise RecordError(file, line, None, f"a task is a JSON object, got {short(row)}")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise RecordError(file, line, unknown[0], f"unknown field; fields: {', '.join(FIELDS)}")
    turns = _turns(row, file, line, options.get("env"))
    task_tools = _tools(row, file, line, tools)
    gold = _gold(row, file, line, len(turns), {t["name"] for t in task_tools})
    metadata = row.get("metadata", {})
    if not isinstance(metadata, dict):
        raise RecordError(file, line, "metadata", f"must be an object, got {short(metadata)}")
    system = row.get("system_prompt", options.get("system_prompt") or "")
    if not isinstance(system, str):
        raise RecordError(file, line, "system_prompt", f"must be a string, got {short(system)}")
    extra: dict[str, Any] = {"metadata": metadata}
    if options.get("reward"):
        extra["reward"] = options["reward"]
    benchmark, category = options.get("benchmark") or "tasks", str(metadata.get("category", ""))
    return Task(id=str(row.get("id", f"{file.stem}-{line}")), benchmark=benchmark, category=category,
                system_prompt=system, tools=task_tools, user_turns=list(turns), gold=gold,
                env=options.get("env"), extra=extra)  # fmt: skip


def _rows(path: Path, split: str) -> list[tuple[Path, int, Any]]:
    """``(file, line, row)`` of every row of ``split`` under ``path``."""
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()):
        return _dataset_rows(path, split)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl")) if split == "all" else [path / f"{split}.jsonl"]
        if not files or not files[0].exists():
            raise RecordError(path, None, None, f"no {'*' if split == 'all' else split}.jsonl in this folder")
        return [(f, n, row) for f in files for n, row in read_jsonl(f)]
    rows = [(path, n, row) for n, row in read_jsonl(path)]
    return [r for r in rows if split == "all" or not isinstance(r[2], dict) or r[2].get("split", split) == split]


def _dataset_rows(path: Path, split: str) -> list[tuple[Path, int, Any]]:
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split != "all" and split not in data:
            raise RecordError(path, None, None, f"no split {split!r}; splits: {', '.join(data)}")
        parts = [data[split]] if split != "all" else list(data.values())
        return [(path, i + 1, dict(row)) for part in parts for i, row in enumerate(part)]
    rows = [(path, i + 1, dict(row)) for i, row in enumerate(data)]
    return [r for r in rows if split == "all" or r[2].get("split", split) == split]


def load_tasks(split: str = "all", path: str | None = None, **options: Any) -> list[Task]:
    """The tasks of ``path`` for ``split`` (see the module docstring)."""
    if not path:
        raise ValueError(
            "source 'tasks' needs a path: a .jsonl file, a folder of <split>.jsonl files, or a datasets folder"
        )
    unknown = sorted(set(options) - {"env", "reward", "benchmark", "system_prompt"})
    if unknown:
        raise ValueError(
            f"source 'tasks': unknown option {unknown[0]!r}; options: env, reward, benchmark, system_prompt"
        )
    rows = _rows(Path(path), split)
    if not rows:
        raise RecordError(path, None, None, f"no task has split {short(split)}")
    needs_tools = any(isinstance(r, dict) and r.get("tools") is None for _, _, r in rows)
    env = options.get("env")
    tools = env_tools(env) if env and needs_tools else None
    problem = next((p for p in map(schema_problem, tools or []) if p is not None), None)
    if problem is not None:
        raise ValueError(f"source 'tasks': env lists an unusable tool schema: {problem}")
    return [parse_row(row, file, line, options, tools) for file, line, row in rows]
