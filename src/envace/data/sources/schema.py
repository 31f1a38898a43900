"""One rule, for every source, for a gold call whose arguments break its tool's own JSON Schema.

A task's ``gold`` is what the *act* role learns to write (the grounded warm start trains the
assistant turns of the gold conversation; the rewards compare calls with it). A call that breaks
its tool's schema (``{"symbol": 5}`` for a ``string``; a missing required argument; an argument the
tool does not take; a tool not offered at that turn) teaches a wrong call, so it is never gold:

* **answered with an error** in the record (a chat log's ``tool`` message holding a JSON object with
  an ``error`` key: the tool refused it, as a real log may show before a corrected retry): the call
  is kept only as that error-answered call, in ``recorded`` (what the *rehearse* role and the Replay
  responder see a tool answer), and left out of ``gold``;
* **anything else** (answered as a success, unanswered, or a benchmark's gold, which records no
  answer) refuses the record: one line naming the file, line and field,
  ``logs.jsonl:3: messages[2].tool_calls[0].function.arguments.symbol: 5 is not of type 'string'``.

The check is JSON Schema's, with BFCL's Python type names mapped as the rollout's
:func:`envace.protocol.parse.validate_call` maps them; an argument the schema does not list breaks
it only where the schema says ``additionalProperties: false`` (the rollout, stricter, refuses any
unlisted argument a model writes). Chat logs apply
it while reading (:mod:`envace.data.sources.chatlog`); ``envace data prepare`` applies it to the
tasks of every other source (:func:`gold_breaks`).
"""

from __future__ import annotations

import json
from typing import Any

from envace.protocol.parse import _parameters, _validator, tool_name
from envace.types import JSON, Task, ToolCall, ToolSchema


def _path(parts: Any) -> str:
    """A JSON-Schema error's path as field syntax: ``.a.b[2]`` (``""`` for the arguments object)."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def argument_error(call: ToolCall, tools: list[ToolSchema]) -> tuple[str, str] | None:
    """``(path, why)`` where ``call`` breaks the schema of its tool among ``tools`` (``path`` relative to
    the arguments object: ``""``, ``.symbol``, ``.items[0].qty``); ``None`` when it is valid.

    >>> tools = [{"name": "quote", "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}},
    ...           "required": ["symbol"], "additionalProperties": False}}]
    >>> argument_error(ToolCall("quote", {"symbol": 5}), tools)
    ('.symbol', "5 is not of type 'string'")
    >>> argument_error(ToolCall("quote", {}), tools)
    ('', "'symbol' is a required property")
    >>> argument_error(ToolCall("quote", {"symbol": "X", "when": 1}), tools)
    ('', "unknown argument 'when' (the tool takes 'symbol')")
    >>> argument_error(ToolCall("quote", {"symbol": "X"}), tools) is None
    True
    """
    import jsonschema

    by_name = {tool_name(t): t for t in tools}
    if call.name not in by_name:
        return "", f"no tool named {call.name!r} is offered here"
    schema = _parameters(by_name[call.name])
    known = schema.get("properties")
    if isinstance(known, dict) and schema.get("additionalProperties") is False:  # JSON Schema: extras allowed
        extra = sorted(set(call.arguments) - set(known))
        if extra:
            takes = ", ".join(repr(k) for k in known) or "no arguments"
            return "", f"unknown argument {extra[0]!r} (the tool takes {takes})"
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
        error = jsonschema.exceptions.best_match(validator.iter_errors(call.arguments))
    except Exception as exc:  # a broken tool schema: no call can be checked against it
        return "", f"the schema of {call.name!r} is unusable: {exc}"
    return None if error is None else (_path(error.absolute_path), error.message)


def refused(response: JSON) -> bool:
    """Whether a recorded answer is an error: a JSON object with an ``error`` key.

    >>> refused({"error": "symbol must be a string"}), refused({"result": "error"}), refused([1])
    (True, False, False)
    """
    return isinstance(response, dict) and "error" in response


def gold_breaks(task: Task) -> list[tuple[int, int, str, str]]:
    """``(turn, index, path, why)`` of every gold call that breaks its tool's schema at its turn."""
    out = []
    for turn, calls in enumerate(task.gold):
        tools = task.tools_at(turn)
        for index, call in enumerate(calls):
            found = argument_error(call, tools)
            if found is not None:
                out.append((turn, index, *found))
    return out


def check_gold(task: Task) -> None:
    """Raise a one-line ``ValueError`` naming the task's first gold call that breaks its tool's schema
    (where the task was read from, when its source recorded it)."""
    breaks = gold_breaks(task)
    if not breaks:
        return
    turn, index, path, why = breaks[0]
    where = task.extra.get("source") or f"task {task.id}"
    more = f" (and {len(breaks) - 1} more)" if len(breaks) > 1 else ""
    name = task.gold[turn][index].name
    raise ValueError(f"{where}: gold[{turn}][{index}].arguments{path}: {why} ({name}: a call that breaks its "
                     f"tool's schema is never trained as a good act){more}")  # fmt: skip
