"""A real environment backed by an MCP server, through the official ``mcp`` SDK (no protocol code here).

``task.env = {"kind": "mcp", "server": {...}}`` (:class:`~envace.envs.mcp_spec.ServerSpec`): a stdio
command or a streamable-HTTP URL. ``tools/list`` gives the tool block (:func:`list_server_tools`:
name, description, the input schema as ``parameters``, the output schema as ``response``), read once
when the tasks are loaded; ``tools/call`` answers each call (:func:`response_of`: the structured
content, else the text parsed as JSON, else ``{"text": ...}``; ``isError`` a ``TOOL_ERROR``
observation).

Isolation: ONE MCP SESSION PER EPISODE. A stdio server is one process per session, so an episode's
state dies with it; an HTTP server sees one MCP session per episode and must keep its state per
session (the example server does: ``examples/shop_mcp/server.py``). The session is opened at the
episode's first call and closed when the episode ends (:meth:`MCPEnvironment.close`).

Every call crosses :meth:`~envace.envs.base.Environment.guarded` like any real environment's: the
arguments are validated against the tool's schema before anything is sent (a model-written call
that fails never reaches the server), the call is bounded (connect, list and call deadlines, in
:mod:`envace.envs.mcp_bridge`), and whatever comes back is JSON-safe. A server that crashes, hangs
or writes garbage answers a structured error with a stable code, and one line on stderr the first
time each server fails each way; after a failure the episode's environment is broken (its state is
unknown) and answers ``ENVIRONMENT_BROKEN``.
"""

from __future__ import annotations

import logging
from typing import Any

from envace.envs.base import DEFAULT_CALL_TIMEOUT_S, ENVIRONMENT_BROKEN, Environment, json_safe
from envace.envs.mcp_bridge import MCPFailure, MCPSession
from envace.envs.mcp_spec import ServerSpec
from envace.protocol import strict_json
from envace.protocol.parse import validate_call
from envace.types import JSON, Task, ToolCall, ToolSchema, error_observation

TOOL_ERROR = "TOOL_ERROR"
log = logging.getLogger(__name__)
# the SDK logs a server's garbage with a traceback; the one line of report_once says it instead
logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)
_reported: set[tuple[Any, ...]] = set()


def report_once(spec: ServerSpec, failure: MCPFailure) -> None:
    """One line on stderr (the logger's warning) the first time ``spec``'s server fails with this code."""
    key = (spec.key, failure.code)
    if key not in _reported:
        _reported.add(key)
        log.warning("envace: MCP server %s: %s: %s", spec.label, failure.code, str(failure).splitlines()[0][:300])


def tool_schema(tool: Any) -> ToolSchema:
    """An MCP ``Tool`` as the tool schema tasks hold (``response`` from its output schema, when it has one).

    >>> from types import SimpleNamespace as T
    >>> tool_schema(T(name="add", description="Add.", input_schema={"type": "object"}, output_schema=None))
    {'name': 'add', 'description': 'Add.', 'parameters': {'type': 'object'}}
    """
    schema: ToolSchema = {"name": tool.name, "description": (tool.description or "").strip()}
    schema["parameters"] = dict(tool.input_schema or {"type": "object", "properties": {}})
    if getattr(tool, "output_schema", None):
        schema["response"] = dict(tool.output_schema)
    return json_safe(schema)  # type: ignore[no-any-return]


def list_server_tools(spec: ServerSpec | dict[str, Any]) -> list[ToolSchema]:
    """The tools ``spec``'s server lists (one session, opened and closed here); a failure is a one-line
    :class:`ValueError` naming the server."""
    spec = ServerSpec.parse(spec)
    session = MCPSession(spec)
    try:
        return [tool_schema(t) for t in session.list_tools()]
    except MCPFailure as exc:
        why = str(exc).removeprefix(f"{spec.label}: ")  # the label is said once
        raise ValueError(f"MCP server {spec.label}: tools/list failed: {exc.code}: {why}") from None
    finally:
        session.close()


def _text_json(text: str) -> JSON:
    """A text block as JSON when it is JSON (the strict reader), else ``{"text": text}``."""
    try:
        return strict_json.loads(text)
    except ValueError:
        return {"text": text}


def _block(block: Any) -> JSON:
    kind = getattr(block, "type", "")
    if kind == "text":
        return _text_json(block.text)
    if kind in ("image", "audio"):
        return {"type": kind, "mime_type": getattr(block, "mime_type", None), "bytes_base64": len(block.data or "")}
    if kind == "resource_link":
        return {"type": kind, "uri": str(block.uri), "name": getattr(block, "name", None)}
    if kind == "resource":
        res = block.resource
        return {"type": kind, "uri": str(res.uri), "text": getattr(res, "text", None)}
    return {"type": str(kind)}


def response_of(result: Any) -> JSON:
    """The JSON an episode holds for a ``CallToolResult``.

    >>> from types import SimpleNamespace as T
    >>> text = lambda s: T(type="text", text=s)
    >>> response_of(T(is_error=False, structured_content={"result": 3}, content=[text("3")]))
    {'result': 3}
    >>> response_of(T(is_error=False, structured_content=None, content=[text('{"id": "o-1"}')]))
    {'id': 'o-1'}
    >>> response_of(T(is_error=True, structured_content=None, content=[text("Unknown order o-9")]))
    {'error': {'code': 'TOOL_ERROR', 'message': 'Unknown order o-9'}}
    """
    blocks = list(getattr(result, "content", None) or [])
    if getattr(result, "is_error", False):
        text = " ".join(b.text for b in blocks if getattr(b, "type", "") == "text").strip()
        return error_observation(TOOL_ERROR, text[:2000] or "the tool reported an error")
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return json_safe(structured)
    if len(blocks) == 1:
        return json_safe(_block(blocks[0]))
    return json_safe([_block(b) for b in blocks])


class MCPEnvironment(Environment):
    """One episode's MCP session (see the module docstring).

    Args:
        spec: the server and its deadlines.
        tools: the task's tool block (what calls are validated against).
        call_timeout_s: ignored in favour of the spec's deadlines (the guard's outer bound is their sum).
    """

    def __init__(self, spec: ServerSpec, tools: list[ToolSchema], call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S):
        super().__init__(call_timeout_s=spec.connect_timeout_s + spec.call_timeout_s + 2.0)
        self.spec, self._tools = spec, list(tools)
        self.session = MCPSession(spec)
        self.calls = 0

    @classmethod
    def from_task(cls, task: Task, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> MCPEnvironment:
        env = task.env or {}
        try:
            spec = ServerSpec.parse(env.get("server") or {})
        except ValueError as exc:
            raise ValueError(f"task {task.id}: env.server: {exc}") from None
        tools = [t for turn in range(len(task.user_turns) + 1) for t in task.tools_at(turn)]
        unique = list({t["name"]: t for t in tools}.values())
        return cls(spec, unique, call_timeout_s)

    def tools(self) -> list[ToolSchema]:
        return list(self._tools)

    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        if validate:
            error = validate_call(call, self._tools)
            if error is not None:
                return error
        return self.guarded(call, lambda: self._call(call))

    def _call(self, call: ToolCall) -> JSON:
        try:
            result = self.session.call_tool(call.name, call.arguments)
        except MCPFailure as exc:
            report_once(self.spec, exc)
            self._broken_by = call.name
            return error_observation(exc.code, str(exc))
        self.calls += 1
        return response_of(result)

    def guarded(self, call: ToolCall, run: Any) -> JSON:
        if self._broken_by is not None:
            failure = self.session._failure
            why = f"{failure.code}: {failure}" if failure is not None else "an earlier call failed"
            return error_observation(ENVIRONMENT_BROKEN, f"this episode's MCP session failed ({why})")
        return super().guarded(call, run)

    def snapshot(self) -> JSON:
        """The server's state is its own; what is known here: the calls answered and whether it broke."""
        return {"server": self.spec.label, "calls": self.calls, "broken": self.broken}

    def close(self) -> None:
        self.session.close()
