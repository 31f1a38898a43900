"""One gold call edited, for the agreement study's perturbations (`perturb`).

Argument values changed (:func:`_arg_edits`: another value of the type, a dropped argument, a case
or number edit, another value the gold or BFCL's enum descriptions allow, a float for an
``integer``), spelled another way that the reward counts as equal (:func:`_equivalents`), or the
call replaced by another visible tool (:func:`_replacements`); the read-only tools per API class
(:data:`READ_ONLY`) and whether a call writes compared state (:func:`_writes_state`, by the
effects table). Every edit is kept only where it still fits the task's tool schemas.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from envace.protocol import tool_name
from envace.protocol.parse import validate_call
from envace.rewards.bfcl import calls_equivalent, tool_classes
from envace.rewards.bfcl_effects import call_effects, public
from envace.types import Task, ToolCall, ToolSchema

#: argument-free methods that leave an API instance's state unchanged (tested on fresh instances)
READ_ONLY: dict[str, tuple[str, ...]] = {
    "GorillaFileSystem": ("pwd", "ls"),
    "MessageAPI": ("list_users",),
    "TwitterAPI": ("posting_get_login_status",),
    "TicketAPI": ("ticket_get_login_status",),
    "TradingBot": ("get_current_time", "trading_get_login_status"),
    "TravelAPI": ("list_all_airports", "travel_get_login_status"),
    "VehicleControlAPI": ("check_tire_pressure", "get_current_speed"),
}


def _visible(task: Task, turn: int) -> dict[str, ToolSchema]:
    return {tool_name(t): t for t in task.tools_at(turn)}


def _valid(task: Task, turn: int, call: ToolCall) -> bool:
    return validate_call(call, task.tools_at(turn)) is None


def _props(schema: ToolSchema | None) -> dict[str, Any]:
    fn = (schema or {}).get("function", schema or {})
    return dict((fn.get("parameters") or {}).get("properties") or {})


def _changed(value: Any, prop: dict[str, Any], rng: random.Random) -> Any:
    """A different value of the same type (another enum member where there is an enum), or ``None``."""
    others = [v for v in prop.get("enum") or [] if v != value]
    if others:
        return rng.choice(others)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + (1 if isinstance(value, int) else 1.5)
    if isinstance(value, str):
        return value + "_2" if value else "x"
    if isinstance(value, list) and value:
        return value[:-1]
    return None


def _flipped(value: Any) -> Any:
    """The same number in the other JSON spelling (5 <-> 5.0; lists element-wise), or ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list) and value and all(_flipped(v) is not None for v in value):
        return [_flipped(v) for v in value]
    return None


def _read_only(task: Task, turn: int) -> list[str]:
    visible = _visible(task, turn)
    classes = (task.env or {}).get("involved_classes", [])
    return [n for c in classes for n in READ_ONLY.get(c, ()) if n in visible]


def _owner(task: Task) -> dict[str, str]:
    return tool_classes(tuple((task.env or {}).get("involved_classes") or ()))


def _writes_state(task: Task, call: ToolCall) -> bool:
    """Whether the call may change state that the official checker compares (by the effects table)."""
    effects = call_effects(_owner(task).get(call.name, ""), call)
    return effects is not None and any(public(k) for k in effects[1])


def _gold_values(task: Task, key: str, like: Any) -> list[Any]:
    """The other values of ``like``'s type that the task's gold passes as argument ``key``."""
    seen = [c.arguments[key] for turn in task.gold for c in turn if key in c.arguments]
    return [v for n, v in enumerate(seen) if type(v) is type(like) and v != like and v not in seen[:n]]


def _enum(prop: dict[str, Any]) -> list[Any]:
    """The allowed values of an argument (or of its items): the schema's ``enum``, else the
    ``[Enum]: [...]`` list that BFCL's descriptions carry."""
    if prop.get("enum"):
        return list(prop["enum"])
    items = prop.get("items") or {}
    if items.get("enum"):
        return list(items["enum"])
    found = re.search(r"\[Enum\]: (\[[^\]]*\])", str(prop.get("description", "")))
    try:
        values = json.loads(found.group(1)) if found else []
    except json.JSONDecodeError:
        return []
    return values if isinstance(values, list) else []


def _config_names(task: Task, api_class: str) -> list[str]:
    """Identifier-like strings of the class's initial state (dict keys and short values without
    spaces below its attributes: file names, user and card ids, airports), first seen first."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and 0 < len(value) <= 40 and " " not in value and value not in out:
            out.append(value)

    for value in (((task.env or {}).get("initial_config") or {}).get(api_class) or {}).values():
        walk(value)  # below the attributes: their names are no values
    return out


def _other_values(task: Task, key: str, value: Any, prop: dict[str, Any], api_class: str) -> list[Any]:
    """Plausible other values of an argument, of its type: the other boolean; the other allowed
    values (:func:`_enum`; for a list of them, the list without one item, or one item it lacks); a
    number +1 (an int) or halved (a float, so that a bounded one stays in range); for a string
    another value the task's gold passes as this argument, else a name from the class's initial
    state (:func:`_config_names`), else the string with ``_2`` appended."""
    if isinstance(value, bool):
        return [not value]
    allowed = _enum(prop)
    if isinstance(value, list):
        smaller = [[v for v in value if v != x] for x in value] if len(value) > 1 else []
        return smaller + [[x] for x in allowed if x not in value] + _gold_values(task, key, value)
    if allowed:
        return [v for v in allowed if v != value]
    if isinstance(value, int | float):
        return [value + 1 if isinstance(value, int) else value / 2 if value else 1.0]
    if not isinstance(value, str):
        return []
    names = [v for v in _config_names(task, api_class) if v != value]
    return _gold_values(task, key, value) or names or [value + "_2" if value else "x"]


def _edited(value: Any, kind: str, task: Task, key: str, prop: dict[str, Any]) -> list[Any]:
    """The argument edits of ``kind``: ``arg_case`` the letters' case of a free string, ``arg_numeric``
    a number changed (an int +1, a float x1.1), ``arg_other_value`` another value the gold passes as
    this argument (another enum member for an enum)."""
    if kind == "arg_case":
        if not isinstance(value, str) or prop.get("enum") or value.upper() == value.lower():
            return []
        return [value.upper() if value != value.upper() else value.lower()]
    if kind == "arg_numeric":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return []
        return [value + 1 if isinstance(value, int) else round(value * 1.1, 6) if value else 0.5]
    if kind == "arg_other_value" and isinstance(value, str | list):
        return [v for v in _enum(prop) if v != value and type(v) is type(value)] or _gold_values(task, key, value)
    return []


def _arg_edits(task: Task, kind: str, t: int, call: ToolCall, rng: random.Random) -> list[tuple[ToolCall, str]]:
    """Valid versions of gold call ``call`` of turn ``t`` with one argument edited by ``kind``."""
    props = _props(_visible(task, t).get(call.name))
    out: list[tuple[ToolCall, str]] = []
    for k, v in call.arguments.items():
        prop = props.get(k) or {}
        if kind == "change_arg":
            values = [] if (changed := _changed(v, prop, rng)) is None else [changed]
        elif kind == "drop_arg":
            out.append((ToolCall(call.name, _without(call.arguments, k)), f"dropped {k}"))
            continue
        elif kind == "float_for_integer":
            values = [float(v)] if type(v) is int and prop.get("type") == "integer" else []
        else:
            values = _edited(v, kind, task, k, prop)
        out += [(ToolCall(call.name, {**call.arguments, k: new}), f"{k}={v!r}->{new!r}") for new in values]
    return [(new, note) for new, note in out if kind == "drop_arg" or _valid(task, t, new)]


ARG_KINDS = ("change_arg", "drop_arg", "float_for_integer", "arg_case", "arg_numeric", "arg_other_value")


def _without(arguments: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if k != key}


def _replacements(task: Task, turn: int, call: ToolCall) -> list[ToolCall]:
    """Valid calls of another visible tool that take the call's arguments (or none at all)."""
    out = []
    for name, schema in _visible(task, turn).items():
        if name == call.name:
            continue
        props = _props(schema)
        new = ToolCall(name, {k: v for k, v in call.arguments.items() if k in props})
        if (new.arguments or name in _read_only(task, turn)) and _valid(task, turn, new):
            out.append(new)
    return out


def _equivalents(task: Task, turn: int, call: ToolCall, props: dict[str, Any]) -> list[tuple[ToolCall, str]]:
    """The call with one argument spelled another way that the reward counts as equal
    (:func:`~envace.rewards.bfcl.calls_equivalent`): a number as int/float (not a float for an
    ``integer``), an omitted default written out, a value equal to its default omitted."""
    out = []
    for k, v in call.arguments.items():
        flipped = _flipped(v)
        if flipped is not None:
            out.append((ToolCall(call.name, {**call.arguments, k: flipped}), f"{k}={v!r}->{flipped!r}"))
        if "default" in props.get(k, {}) and props[k]["default"] == v:
            out.append((ToolCall(call.name, _without(call.arguments, k)), f"{k} omitted"))
    for k, p in props.items():
        if k not in call.arguments and isinstance(p, dict) and "default" in p and p["default"] != "None":
            out.append((ToolCall(call.name, {**call.arguments, k: p["default"]}), f"{k}={p['default']!r} written"))
    schema = _visible(task, turn).get(call.name)
    return [(new, note) for new, note in out if _valid(task, turn, new) and calls_equivalent(call, new, schema)]
