"""The kinds of drift: pure functions from a tool response, or a tool block, to its drifted form.

Every kind is a :class:`Kind`: ``response(response, rng)`` transforms what a call returns,
``tools(tools, rng)`` the tool block of documented drift (the policy's docs updated to match).
Choices come from a :class:`~envace.envs.drift_support.Chooser`: seeded and *keyed*, never a running
stream, so the same key gets the same choice in every response and in the docs
(``current_directory_content`` becomes the same new name in each response of an episode and in its
tool block). Nothing here mutates its input.

Error observations (``{"error": ...}``) are changed by ``reword_errors`` only: the other kinds keep
the envelope, so a refusal stays recognisable to the code that reads it (tau2's scorer aligns the
calls that ran by their codes). The codes of envace's own refusals (:data:`PROTOCOL_CODES`) stay too.
See docs/drift.md for the catalogue with examples.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from envace.envs.base import ENVIRONMENT_BROKEN, TIMEOUT
from envace.envs.drift_support import (
    Chooser,
    each_tool,
    function_of,
    identifier_options,
    is_number,
    map_dicts,
    map_leaves,
    noted,
    rename_each_key,
    renamed,
    schema_fields,
    schema_props,
    unless_error,
    with_response,
)
from envace.protocol.parse import CallError
from envace.types import JSON, ToolSchema, is_error

#: codes of envace's own refusals (the call never ran): kept by ``reword_errors``
PROTOCOL_CODES = frozenset(
    {CallError.UNKNOWN_TOOL, CallError.INVALID_ARGUMENTS, CallError.MALFORMED, CallError.JSON_DECODE,
     CallError.UNCLOSED_TAG, CallError.TOO_MANY_CALLS, TIMEOUT, ENVIRONMENT_BROKEN}
)  # fmt: skip
WRAPPERS = ("result", "data", "payload", "response")
DATE_FORMATS = (("%m/%d/%Y", "MM/DD/YYYY"), ("%d %b %Y", "DD Mon YYYY"), ("%Y%m%d", "YYYYMMDD"),
                ("%d.%m.%Y", "DD.MM.YYYY"))  # fmt: skip
# quantity (matched in a key, lowercased, underscores dropped) -> its name, its unit in BFCL's docs,
# and the units it may drift to: (name, scale, offset), new = old * scale + offset
UNITS: dict[str, tuple[str, str, tuple[tuple[str, float, float], ...]]] = {
    "temperature": ("temperatures", "degrees Celsius", (("degrees Fahrenheit", 1.8, 32.0), ("kelvin", 1.0, 273.15))),
    "distance": ("distances", "km", (("miles", 0.621371, 0.0), ("meters", 1000.0, 0.0))),
    "speed": ("speeds", "km/h", (("miles per hour", 0.621371, 0.0), ("meters per second", 1 / 3.6, 0.0))),
    "pressure": ("pressures", "psi", (("kilopascals", 6.894757, 0.0), ("bar", 0.0689476, 0.0))),
    "fuellevel": ("fuel levels", "gallons", (("liters", 3.785411, 0.0), ("imperial gallons", 0.832674, 0.0))),
}
REPHRASE = (  # (pattern, replacement): whole words or phrases, so identifiers inside a message stay as they are
    (r"\bno such file or directory\b", "path not found"), (r"\bnot found\b", "could not be located"),
    (r"\bdoes not exist\b", "is unknown"), (r"\balready exists\b", "is already present"),
    (r"\bnot authenticated\b", "not signed in"), (r"\binvalid\b", "malformed"), (r"\bfailed\b", "did not succeed"),
    (r"\binsufficient\b", "not enough"), (r"\bplease\b", "kindly"), (r"\bpermission denied\b", "access refused"),
)  # fmt: skip
_PHRASES = re.compile("|".join(old for old, _ in REPHRASE), re.IGNORECASE)
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:([T ])(\d{2}:\d{2}(?::\d{2})?))?")
TEMPLATES = ("Request failed: {}", "{} (the operation was not completed)", "Operation unsuccessful - {}")


@dataclass(frozen=True)
class Kind:
    """One kind of drift: its one-line summary, and its transforms of a response and of a tool block."""

    name: str
    summary: str
    response: Callable[[JSON, Chooser], JSON]
    tools: Callable[[list[ToolSchema], Chooser], list[ToolSchema]]


# --------------------------------------------------------------------------- the kinds


def _rename_keys_response(response: JSON, rng: Chooser) -> JSON:
    return map_dicts(response, lambda d: rename_each_key(d, lambda k: renamed(k, rng, "rename_keys")))


def _rename_keys_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    props = lambda d: rename_each_key(d, lambda k: renamed(k, rng, "rename_keys"))  # noqa: E731
    return with_response(lambda s: schema_props(s, props))(tools)


def _wrapper(rng: Chooser) -> str:
    return rng.pick(WRAPPERS, "nest_result")


def _nest_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    key = _wrapper(rng)
    return with_response(lambda s: {"type": "dict", "properties": {key: s}})(tools)


def _reordered(mapping: dict[str, Any], rng: Chooser) -> dict[str, Any]:
    """``mapping`` in the seeded order of its keys (reversed when that is the order it had)."""
    order = rng.order(mapping, "reorder_keys")
    if order == list(mapping):
        order.reverse()
    return {k: mapping[k] for k in order}


def _reorder_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    return with_response(lambda s: schema_props(s, lambda d: _reordered(d, rng)))(tools)


# name -> (its documented schema, its value from the response and the chooser)
FIELDS: dict[str, tuple[dict[str, str], Callable[[JSON, Chooser], JSON]]] = {
    "request_id": ({"type": "string", "description": "Identifier of this request."},
                   lambda r, rng: "req_" + rng.token("request_id", json.dumps(r, sort_keys=True))),
    "api_version": ({"type": "string", "description": "Version of the API that answered."},
                    lambda r, rng: f"2.{rng.index(10, 'api_version')}.0"),
    "deprecation_warning": ({"type": "string", "description": "A notice of changes to come."},
                            lambda r, rng: "This endpoint changes in the next API version."),
    "rate_limit_remaining": ({"type": "integer", "description": "Calls left in the current window."},
                             lambda r, rng: 1000 - rng.index(1000, "rate", json.dumps(r, sort_keys=True))),
    "server_region": ({"type": "string", "description": "Region of the server that answered."},
                      lambda r, rng: rng.pick(("eu-west-1", "us-east-2", "ap-south-1"), "region")),
}  # fmt: skip


def added_fields(rng: Chooser) -> list[str]:
    """The two fields of :data:`FIELDS` that ``add_fields`` adds under this seed."""
    return rng.order(FIELDS, "add_fields")[:2]


def _add_fields_response(response: JSON, rng: Chooser) -> JSON:
    if not isinstance(response, dict):
        return response
    extra = {n: FIELDS[n][1](response, rng) for n in added_fields(rng) if n not in response}
    return {**response, **extra}


def _add_fields_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    def add(schema: dict[str, Any]) -> dict[str, Any]:
        props = dict(schema.get("properties") or {})
        props.update({n: dict(FIELDS[n][0]) for n in added_fields(rng) if n not in props})
        return {**schema, "properties": props}

    return with_response(add)(tools)


def _number_text(value: Any) -> Any:
    return str(value) if is_number(value) else value


def _strings_schema(props: dict[str, Any]) -> dict[str, Any]:
    def one(prop: Any) -> Any:
        if isinstance(prop, dict) and prop.get("type") in ("integer", "float", "number"):
            return {**prop, "type": "string", "description": f"{prop.get('description', '')} Written as a string."}
        return prop

    return {k: one(v) for k, v in props.items()}


def _undocumented(note: str) -> Callable[[dict[str, Any]], str | None]:
    """``note`` for a tool whose response is not documented (its schema says the rest)."""
    return lambda f: None if isinstance(f.get("response"), dict) else note


def _numbers_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    tools = with_response(lambda s: schema_props(s, _strings_schema))(tools)
    return noted(tools, _undocumented("Numbers in responses are written as strings."))


def unit_choice(quantity: str, rng: Chooser) -> tuple[str, float, float]:
    """The unit a quantity of :data:`UNITS` drifts to under this seed: ``(name, scale, offset)``."""
    return rng.pick(UNITS[quantity][2], "units", quantity)


def _quantity(key: str | None) -> str | None:
    flat = (key or "").lower().replace("_", "")
    return next((q for q in UNITS if q in flat), None)


def _units_response(response: JSON, rng: Chooser) -> JSON:
    def convert(key: str | None, value: Any) -> Any:
        quantity = _quantity(key)
        if quantity is None or not is_number(value) or abs(value) > 1e300:
            return value
        _, scale, offset = unit_choice(quantity, rng)
        return round(value * scale + offset, 2)

    return map_leaves(response, convert)


def _units_note(f: dict[str, Any], rng: Chooser) -> str | None:
    """The unit changes of the quantities a tool's documented response holds (all, undocumented)."""
    response = f.get("response")
    found = {_quantity(k) for k, _ in schema_fields(response)} if isinstance(response, dict) else set(UNITS)
    changes = [f"{UNITS[q][0]} in {unit_choice(q, rng)[0]} (not {UNITS[q][1]})" for q in UNITS if q in found]
    return f"Units in responses: {', '.join(changes)}." if changes else None


def _units_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    return noted(tools, lambda f: _units_note(f, rng))


def date_choice(rng: Chooser) -> tuple[str, str]:
    """The date format of this seed: ``(strftime pattern, how the docs write it)``."""
    return rng.pick(DATE_FORMATS, "date_format")


def _dates_response(response: JSON, rng: Chooser) -> JSON:
    pattern = date_choice(rng)[0]

    def reformat(_: str | None, value: Any) -> Any:
        match = _DATE.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            return value
        try:
            day = dt.date.fromisoformat(match[1]).strftime(pattern)
        except ValueError:  # 2024-13-45 looks like a date but is none
            return value
        return f"{day} {match[3]}" if match[3] else day

    return map_leaves(response, reformat)


def _has_dates(f: dict[str, Any]) -> bool:
    """Whether a tool's response may hold dates: undocumented, or a documented field about dates."""
    response = f.get("response")
    if not isinstance(response, dict):
        return True
    return any(re.search(r"date|time", f"{k} {p.get('description', '')}", re.I) for k, p in schema_fields(response))


def _dates_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    note = f"Dates in responses are written {date_choice(rng)[1]} (not YYYY-MM-DD)."
    return noted(tools, lambda f: note if _has_dates(f) else None)


def new_code(code: str, rng: Chooser) -> str:
    """A tool's own error code as ``reword_errors`` rewrites it (envace's :data:`PROTOCOL_CODES` stay).

    >>> sorted({new_code("EXECUTION_ERROR", Chooser(s)) for s in range(20)})
    ['E_EXECUTION', 'ExecutionError', 'execution.error']
    """
    if code in PROTOCOL_CODES:
        return code
    parts = [p for p in code.lower().split("_") if p] or ["error"]
    style = rng.index(3, "reword_errors", "code")
    if style == 0:
        return "".join(p.capitalize() for p in parts)
    if style == 1:
        return "E_" + "_".join(p.upper() for p in parts if p != "error") if parts != ["error"] else "E_ERROR"
    return ".".join(parts)


def _rephrased(match: re.Match[str]) -> str:
    return next(new for old, new in REPHRASE if re.fullmatch(old, match[0], re.IGNORECASE))


def reworded(message: str, rng: Chooser) -> str:
    """An error message reworded: its phrases (:data:`REPHRASE`, in one pass), then the seed's template.

    >>> [reworded("cd: No such file or directory", Chooser(s)) for s in (0, 3)]
    ['Request failed: cd: path not found', 'Operation unsuccessful - cd: path not found']
    """
    return rng.pick(TEMPLATES, "reword_errors", "template").format(_PHRASES.sub(_rephrased, message))


def _reword_response(response: JSON, rng: Chooser) -> JSON:
    if not is_error(response):
        return response
    error = response["error"]
    if isinstance(error, str):
        return {**response, "error": reworded(error, rng)}
    if isinstance(error, dict):
        error = dict(error)
        if isinstance(error.get("code"), str):
            error["code"] = new_code(error["code"], rng)
        if isinstance(error.get("message"), str):
            error["message"] = reworded(error["message"], rng)
    return {**response, "error": error}


def _reword_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    example = reworded("<reason>", rng)
    code = new_code("EXECUTION_ERROR", rng)
    return noted(tools, f"A call that fails answers with error code {code!r} and a message such as {example!r}.")


def tool_renaming(names: Iterable[str], rng: Chooser) -> dict[str, str]:
    """``{old name: new name}`` of ``rename_tool``: each tool renamed or not by the seed (about half,
    at least one), to a name no other tool has (another style, synonyms, or a ``_v2`` suffix)."""
    taken = set(names)
    chosen = [n for n in sorted(taken) if rng.index(2, "rename_tool", n) == 0]
    if not chosen and taken:
        chosen = rng.order(taken, "rename_tool")[:1]
    out: dict[str, str] = {}
    for name in chosen:
        options = rng.order([*identifier_options(name), f"{name}_v2"], "rename_tool", name)
        new = next((o for o in options if o not in taken), None)
        if new is not None:
            out[name] = new
            taken.add(new)
    return out


def renamed_tools(tools: list[ToolSchema], renaming: dict[str, str]) -> list[ToolSchema]:
    """``tools`` with the names of ``renaming`` replaced."""

    def rename(f: dict[str, Any]) -> None:
        f["name"] = renaming.get(f["name"], f["name"])

    return each_tool(tools, rename)


def _rename_tool_tools(tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    return renamed_tools(tools, tool_renaming((function_of(t)["name"] for t in tools), rng))


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("rename_keys", "response keys renamed: the other case style (snake_case <-> camelCase) or synonyms",
         unless_error(_rename_keys_response), _rename_keys_tools),
    Kind("nest_result", "the whole response nested under one key ('result', 'data', 'payload' or 'response')",
         unless_error(lambda r, rng: {_wrapper(rng): r}), _nest_tools),
    Kind("reorder_keys", "the keys of every object in another (seeded) order",
         unless_error(lambda r, rng: map_dicts(r, lambda d: _reordered(d, rng))), _reorder_tools),
    Kind("add_fields", "two fields the docs do not mention added to every object response",
         unless_error(_add_fields_response), _add_fields_tools),
    Kind("numbers_as_strings", "every number written as a string (1.5 -> '1.5')",
         unless_error(lambda r, rng: map_leaves(r, lambda _, v: _number_text(v))), _numbers_tools),
    Kind("units", "temperatures, distances, speeds, pressures and fuel levels in other units",
         unless_error(_units_response), _units_tools),
    Kind("date_format", "ISO dates (YYYY-MM-DD) written in another format (MM/DD/YYYY, ...)",
         unless_error(_dates_response), _dates_tools),
    Kind("reword_errors", "error messages reworded and the tools' own error codes renamed",
         _reword_response, _reword_tools),
    Kind("rename_tool", "tools renamed; the old name answers with an error naming the new one",
         lambda r, rng: r, _rename_tool_tools),
)}  # fmt: skip


def _kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"unknown drift kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    return KINDS[kind]


def drift_response(kind: str, response: JSON, rng: Chooser) -> JSON:
    """``response`` as drift ``kind`` transforms it (a new object; ``response`` is not changed)."""
    return _kind(kind).response(response, rng)


def drift_tools(kind: str, tools: list[ToolSchema], rng: Chooser) -> list[ToolSchema]:
    """The tool block of documented drift ``kind`` (deep copies; ``tools`` are not changed)."""
    return _kind(kind).tools(tools, rng)
