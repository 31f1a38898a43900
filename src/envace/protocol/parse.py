"""Parsers for what a model writes: tool calls in an act turn, and rehearsed tool responses.

Model output is data (docs/design.md §3.4): every failure becomes a structured error observation
``{"error": {"code": ..., "message": ...}}`` with one of the stable codes below, never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jsonschema

from envace.protocol import strict_json
from envace.types import JSON, ToolCall, ToolSchema, error_observation

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"


class CallError:
    """Stable error codes for act turns."""

    UNCLOSED_TAG = "CALL_UNCLOSED_TAG"
    JSON_DECODE = "CALL_JSON_DECODE_ERROR"
    MALFORMED = "CALL_MALFORMED"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    TOO_MANY_CALLS = "TOO_MANY_CALLS"


class RehearsalError:
    """Stable error codes for rehearsed responses (the upstream contract)."""

    EMPTY_OUTPUT = "EMPTY_OUTPUT"
    NO_TAG = "NO_TAG"
    TAG_MALFORMED = "TAG_MALFORMED"
    JSON_DECODE = "JSON_DECODE_ERROR"
    INVALID_RESULT_TYPE = "INVALID_RESULT_TYPE"


@dataclass
class ParsedAct:
    """An act turn split into its text and its calls.

    ``calls[i]`` is ``None`` where the i-th ``<tool_call>`` block failed; ``errors[i]`` then holds
    its error observation (the response that call gets), else ``None``.
    """

    content: str
    calls: list[ToolCall | None] = field(default_factory=list)
    errors: list[dict[str, Any] | None] = field(default_factory=list)

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if c is not None]

    @property
    def n_errors(self) -> int:
        return sum(e is not None for e in self.errors)


_CALL_RE = re.compile(re.escape(CALL_OPEN) + r"(.*?)(" + re.escape(CALL_CLOSE) + r"|$)", re.DOTALL)


def _json_in_tags(value: JSON) -> str:
    """JSON text safe inside our XML-ish tags: ``</`` can only occur inside strings, where the JSON
    escape ``<\\/`` reads back as the same value."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


def render_call(call: ToolCall) -> str:
    """The canonical text of one call; :func:`parse_act` reads it back exactly.

    >>> render_call(ToolCall("cd", {"folder": "docs"}))
    '<tool_call>\\n{"name": "cd", "arguments": {"folder": "docs"}}\\n</tool_call>'
    """
    body = _json_in_tags({"name": call.name, "arguments": call.arguments})
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def render_calls(content: str, calls: list[ToolCall]) -> str:
    """An assistant turn body: optional text, then one block per call."""
    parts = [content] if content else []
    parts += [render_call(c) for c in calls]
    return "\n".join(parts)


@lru_cache(maxsize=4096)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)  # type: ignore[no-any-return]


def _parameters(tool: ToolSchema) -> dict[str, Any]:
    fn = tool.get("function", tool)
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return _normalise_schema(params)  # type: ignore[no-any-return]


_TYPE_ALIASES = {
    "dict": "object",
    "float": "number",
    "int": "integer",
    "list": "array",
    "tuple": "array",
    "bool": "boolean",
    "str": "string",
    "any": None,
}


def _normalise_schema(schema: Any) -> Any:
    """Map the Python-flavoured type names some benchmarks use (BFCL: ``dict``, ``float``) to JSON Schema."""
    if isinstance(schema, list):
        return [_normalise_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k == "type" and isinstance(v, str) and v in _TYPE_ALIASES:
            if _TYPE_ALIASES[v] is None:
                continue
            out[k] = _TYPE_ALIASES[v]
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: _normalise_schema(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "not"):
            out[k] = _normalise_schema(v)
        else:
            out[k] = v
    return out


def tool_name(tool: ToolSchema) -> str:
    """The name of a tool schema, OpenAI nested (``{"function": {...}}``) or flat."""
    return str(tool.get("function", tool)["name"])


def validate_call(call: ToolCall, tools: list[ToolSchema]) -> dict[str, Any] | None:
    """Check a call against the tool whitelist and its argument schema.

    Returns ``None`` when the call is valid, else its error observation.

    >>> tools = [{"name": "cd", "parameters": {"type": "object", "properties": {"folder": {"type": "string"}},
    ...           "required": ["folder"]}}]
    >>> validate_call(ToolCall("cd", {"folder": "a"}), tools) is None
    True
    >>> validate_call(ToolCall("rm", {}), tools)["error"]["code"]
    'UNKNOWN_TOOL'
    >>> validate_call(ToolCall("cd", {"folder": 3}), tools)["error"]["code"]
    'INVALID_ARGUMENTS'
    """
    by_name = {tool_name(t): t for t in tools}
    if call.name not in by_name:
        return error_observation(CallError.UNKNOWN_TOOL, f"no tool named {call.name!r}")
    schema = _parameters(by_name[call.name])
    known = schema.get("properties")
    if isinstance(known, dict) and schema.get("additionalProperties", False) is False:
        extra = sorted(set(call.arguments) - set(known))
        if extra:
            return error_observation(CallError.INVALID_ARGUMENTS, f"{call.name}: unknown arguments {extra}")
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
        error = jsonschema.exceptions.best_match(validator.iter_errors(call.arguments))
    except Exception as exc:  # a broken tool schema (unknown type names, bad patterns, ...)
        return error_observation(CallError.INVALID_ARGUMENTS, f"schema of {call.name!r} unusable: {exc}")
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        return error_observation(CallError.INVALID_ARGUMENTS, f"{call.name}: {where}: {error.message}")
    return None


def _rejected(exc: strict_json.JSONRejected) -> dict[str, Any]:
    if exc.kind == "decode":
        return error_observation(CallError.JSON_DECODE, f"tool call is not valid JSON: {exc}")
    return error_observation(CallError.INVALID_ARGUMENTS, f"tool call holds an unusable value: {exc}")


def _parse_call_body(body: str) -> ToolCall | dict[str, Any]:
    try:
        obj = strict_json.loads(body)
    except strict_json.JSONRejected as exc:
        return _rejected(exc)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return error_observation(CallError.MALFORMED, 'a tool call is {"name": <string>, "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = strict_json.loads(args)
        except strict_json.JSONRejected as exc:
            if exc.kind != "decode":  # JSON, but NaN, a lone surrogate, ...: not a string to keep either
                return _rejected(exc)
    if not isinstance(args, dict):
        return error_observation(CallError.MALFORMED, "tool call arguments must be a JSON object")
    return ToolCall(obj["name"], args)


def parse_act(text: str, tools: list[ToolSchema] | None = None, max_calls: int | None = None) -> ParsedAct:
    """Split an act turn into text and calls; each call is checked against ``tools`` when given.

    >>> p = parse_act('ok <tool_call>{"name": "ls", "arguments": {}}</tool_call>')
    >>> p.content, p.calls
    ('ok', [ToolCall(name='ls', arguments={})])
    >>> parse_act("<tool_call>{oops</tool_call>").errors[0]["error"]["code"]
    'CALL_JSON_DECODE_ERROR'
    """
    calls: list[ToolCall | None] = []
    errors: list[dict[str, Any] | None] = []
    for match in _CALL_RE.finditer(text):
        body, close = match.group(1).strip(), match.group(2)
        parsed: ToolCall | dict[str, Any]
        if not close:
            parsed = error_observation(CallError.UNCLOSED_TAG, f"{CALL_OPEN} without {CALL_CLOSE}")
        else:
            parsed = _parse_call_body(body)
        if isinstance(parsed, ToolCall) and tools is not None:
            err = validate_call(parsed, tools)
            parsed = err if err is not None else parsed
        if max_calls is not None and len(calls) >= max_calls:
            parsed = error_observation(CallError.TOO_MANY_CALLS, f"more than {max_calls} calls in one turn")
        calls.append(parsed if isinstance(parsed, ToolCall) else None)
        errors.append(None if isinstance(parsed, ToolCall) else parsed)
    content = _CALL_RE.sub("", text).strip()
    return ParsedAct(content=content, calls=calls, errors=errors)


def render_result(response: JSON) -> str:
    """The tool-turn body for a response: the rehearse role's output contract.

    >>> render_result({"ok": True})
    '<execution_result>{"ok": true}</execution_result>'
    """
    return f"{RESULT_OPEN}{_json_in_tags(response)}{RESULT_CLOSE}"


def parse_rehearsal(text: str) -> JSON:
    """Read a rehearsed tool response: ``<execution_result>`` + a non-empty JSON object or array.

    Returns the parsed JSON, or an error observation with a :class:`RehearsalError` code.

    >>> parse_rehearsal('<execution_result>{"files": ["a"]}</execution_result>')
    {'files': ['a']}
    >>> parse_rehearsal("{}")["error"]["code"]
    'NO_TAG'
    >>> parse_rehearsal("<execution_result>[]</execution_result>")["error"]["code"]
    'INVALID_RESULT_TYPE'
    """
    text = text.strip()
    if not text:
        return error_observation(RehearsalError.EMPTY_OUTPUT, "the rehearsal is empty")
    start = text.find(RESULT_OPEN)
    if start < 0:
        return error_observation(RehearsalError.NO_TAG, f"no {RESULT_OPEN} tag")
    end = text.find(RESULT_CLOSE, start)
    # a second result after the first one's close tag; an opening tag inside the JSON (a string
    # holding it) is the value's own text, since a close tag cannot occur in the rendered JSON
    if end < 0 or RESULT_OPEN in text[end:]:
        return error_observation(RehearsalError.TAG_MALFORMED, f"expected one {RESULT_OPEN}…{RESULT_CLOSE}")
    body = text[start + len(RESULT_OPEN) : end].strip()
    try:
        value = strict_json.loads(body)
    except strict_json.JSONRejected as exc:
        return error_observation(RehearsalError.JSON_DECODE, f"result is not valid JSON: {exc}")
    if not isinstance(value, dict | list) or not value:
        return error_observation(RehearsalError.INVALID_RESULT_TYPE, "result must be a non-empty JSON object or array")
    return value
