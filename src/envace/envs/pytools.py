"""Python tools as a real environment: a module of plain functions, or a class in TRL's ``environment_factory`` shape.

``task.env`` names one of them (config data, imported by name, never model output)::

    {"kind": "python", "module": "my_tools"}                  # its public functions are the tools
    {"kind": "python", "class": "my_envs:Shop"}               # TRL's shape, used as it is

The tool block comes from the code (:func:`function_schema`): each parameter's JSON Schema from its
type hint (pydantic), its description and the tool's from the docstring (Google, NumPy or reST),
required when it has no default.

A TRL-shaped class is used unchanged: one instance per episode, ``reset(**kwargs)`` called first
with the task's ``metadata`` as keyword arguments (a TRL dataset row's columns; what it returns, a
first user message or ``None``, is read by the ``tasks`` source when it loads the task), its public
methods the tools (``reset`` and ``get_reward`` excepted), and an optional ``get_reward()`` read by
the ``python-env`` reward after the episode's calls are replayed into a fresh instance
(:func:`python_env_reward`). A module of plain functions has no per-episode
state of its own: its functions should keep none (or hold it in a class).

Calls cross :meth:`~envace.envs.base.Environment.guarded` as every real environment's do (validated
against the schema first, a deadline, JSON-safe answers); a tool that raises answers
``EXECUTION_ERROR``. What a tool returns: a dict as it is, a string parsed as JSON when it is JSON,
anything else ``{"result": value}``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

from envace.envs.base import DEFAULT_CALL_TIMEOUT_S, Environment, json_safe
from envace.protocol import strict_json
from envace.protocol.parse import validate_call
from envace.rewards.base import RewardOutput, RewardUnavailable
from envace.rewards.userfn import import_named
from envace.types import JSON, Task, ToolCall, ToolSchema, Trajectory

#: methods of a TRL-shaped class that are not tools
NOT_TOOLS = ("reset", "get_reward")


def function_schema(fn: Callable[..., Any], name: str | None = None) -> ToolSchema:
    """The tool schema of ``fn`` from its signature, type hints and docstring.

    >>> def add(a: int, b: float = 1.0) -> dict:
    ...     '''Add two numbers.
    ...
    ...     Args:
    ...         a: the first.
    ...         b: the second.
    ...     '''
    >>> s = function_schema(add)
    >>> s["description"], s["parameters"]["required"], s["parameters"]["properties"]["a"]
    ('Add two numbers.', ['a'], {'type': 'integer', 'description': 'the first.'})
    """
    import docstring_parser
    from pydantic import TypeAdapter

    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    described = {p.arg_name: (p.description or "").strip() for p in doc.params}
    try:
        hints = get_type_hints(fn)
    except Exception:  # a hint that does not resolve: that parameter is left untyped
        hints = {}
    properties: dict[str, Any] = {}
    required = []
    for pname, param in inspect.signature(fn).parameters.items():
        if pname in ("self", "cls") or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        schema: dict[str, Any] = {}
        if pname in hints:
            schema = TypeAdapter(hints[pname]).json_schema()
            schema.pop("title", None)
        if described.get(pname):
            schema["description"] = described[pname]
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        properties[pname] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        parameters["required"] = required
    text = "\n\n".join(t for t in (doc.short_description, doc.long_description) if t)
    return {"name": name or fn.__name__, "description": text.strip(), "parameters": parameters}


def _tools_of(target: Any) -> dict[str, Callable[..., Any]]:
    """The public functions of a module (defined there), or the public methods of a class or instance."""
    if inspect.ismodule(target):
        found = inspect.getmembers(target, inspect.isfunction)
        return {n: f for n, f in found if not n.startswith("_") and f.__module__ == target.__name__}
    cls = target if inspect.isclass(target) else type(target)
    names = [n for n, _ in inspect.getmembers(cls, callable) if not n.startswith("_") and n not in NOT_TOOLS]
    return {n: getattr(target, n) for n in names}


def _target(env: dict[str, Any]) -> Any:
    """The module or class ``env`` names."""
    has_module, has_class = bool(env.get("module")), bool(env.get("class"))
    if has_module == has_class:
        raise ValueError("a python environment names exactly one of 'module' (plain functions) or 'class' (TRL shape)")
    if has_module:
        return import_named(str(env["module"]).partition(":")[0], "tool module")
    cls = import_named(str(env["class"]), "environment class")
    if not inspect.isclass(cls):
        raise ValueError(f"environment class {env['class']!r} is not a class")
    return cls


def python_tools(env: dict[str, Any]) -> list[ToolSchema]:
    """The tool block of the Python tool set ``env`` names."""
    tools = [function_schema(fn, name) for name, fn in _tools_of(_target(env)).items()]
    if not tools:
        raise ValueError(f"python environment {env.get('module') or env.get('class')!r} has no public function")
    return tools


def first_message(env: dict[str, Any], kwargs: dict[str, Any]) -> str | None:
    """What a TRL-shaped class's ``reset(**kwargs)`` returns (the first user message, or ``None``);
    ``None`` for a module of functions."""
    target = _target(env)
    if inspect.ismodule(target):
        return None
    message = target().reset(**kwargs)
    return message if isinstance(message, str) and message.strip() else None


def as_response(value: Any) -> JSON:
    """What a Python tool returned, as the JSON an episode holds.

    >>> as_response({"id": 3}), as_response('{"ok": true}'), as_response("done"), as_response(7)
    ({'id': 3}, {'ok': True}, {'result': 'done'}, {'result': 7})
    """
    if isinstance(value, dict):
        return json_safe(value)
    if isinstance(value, str):
        try:
            parsed = strict_json.loads(value)
        except ValueError:
            return {"result": json_safe(value)}
        return json_safe(parsed) if isinstance(parsed, dict | list) else {"result": json_safe(parsed)}
    return {"result": json_safe(value)}


class PythonToolsEnvironment(Environment):
    """One episode's Python tool set: a module's functions, or a fresh instance of a TRL-shaped class.

    Args:
        env: ``task.env`` (see the module docstring).
        reset_kwargs: what ``reset`` is called with (the task's metadata).
        call_timeout_s: the deadline of one call.
    """

    def __init__(self, env: dict[str, Any], reset_kwargs: dict[str, Any] | None = None,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S):  # fmt: skip
        super().__init__(call_timeout_s)
        target = _target(env)
        self.instance = None if inspect.ismodule(target) else target()
        if self.instance is not None and hasattr(self.instance, "reset"):
            self.instance.reset(**(reset_kwargs or {}))
        self._fns = _tools_of(self.instance if self.instance is not None else target)
        self._tools = [function_schema(fn, name) for name, fn in self._fns.items()]
        self.log: list[tuple[str, JSON]] = []

    @classmethod
    def from_task(cls, task: Task, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> PythonToolsEnvironment:
        return cls(task.env or {}, dict(task.extra.get("metadata") or {}), call_timeout_s)

    def tools(self) -> list[ToolSchema]:
        return list(self._tools)

    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        if validate:
            error = validate_call(call, self._tools)
            if error is not None:
                return error
        fn = self._fns.get(call.name)  # whitelisted: the names listed at construction
        if fn is None:
            return validate_call(call, self._tools)
        response = self.guarded(call, lambda: as_response(fn(**call.arguments)))
        self.log.append((call.name, response))
        return response

    def snapshot(self) -> JSON:
        return {"calls": [name for name, _ in self.log], "responses": [r for _, r in self.log]}

    def get_reward(self) -> float | None:
        """The instance's ``get_reward()``, or ``None`` where it has none."""
        getter = getattr(self.instance, "get_reward", None)
        return None if getter is None else getter()


def python_env_reward(task: Task, traj: Trajectory) -> RewardOutput:
    """Reward ``python-env``: the episode's calls replayed, in order, into a fresh instance of the task's
    TRL-shaped class (``reset`` first), then its ``get_reward()`` (in [0, 1]; ``None``: masked).

    The replay runs the calls as a real environment would (validated, bounded): the state the
    class scores is the one the calls make, whatever responses the episode saw (rehearsed ones
    excuse nothing).
    """
    env = PythonToolsEnvironment.from_task(task)
    if env.instance is None or not hasattr(env.instance, "get_reward"):
        raise ValueError(f"task {task.id}: the python-env reward needs a class with get_reward()")
    for record in traj.calls:
        env.execute(record.call)
    score = env.get_reward()
    if score is None:
        raise RewardUnavailable(f"{type(env.instance).__name__}.get_reward() returned None")
    score = float(score)
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"{type(env.instance).__name__}.get_reward() returned {score!r}, outside [0, 1]")
    return RewardOutput(score, score >= 1.0, {"replayed_calls": len(traj.calls)})
