"""The one protocol every real environment follows, and the boundary every call crosses.

Model-written calls reach an environment only through :meth:`Environment.execute`, which first
validates the call against the tool schemas (:func:`envace.protocol.validate_call`) and then
dispatches to a whitelisted method. Nothing a model writes is passed to ``eval``/``exec``, and no
attribute a model can name freely is looked up.

Every call also crosses :meth:`Environment.guarded`, the same for all environments:

* arguments no tool should see are refused before any tool code runs: non-finite numbers, strings
  with lone surrogates, integers over :data:`MAX_ARGUMENT_INT_DIGITS` digits, nesting deeper than
  :data:`MAX_ARGUMENT_DEPTH` (``INVALID_ARGUMENTS``);
* the call runs under a deadline (:attr:`Environment.call_timeout_s`, see :func:`call_with_deadline`);
  past it the answer is a ``TIMEOUT`` error and the environment is broken for the rest of the
  episode (``ENVIRONMENT_BROKEN``), because the abandoned call may still be changing its state;
* whatever comes back is made JSON-safe (:func:`json_safe`), so an observation always serialises
  with ``allow_nan=False`` and encodes as UTF-8, whatever a third-party tool returned or echoed;
* sizes are bounded both ways (:class:`SizeBounds`, ``task.env``'s ``max_argument_bytes`` and
  ``max_response_bytes``): arguments over the bound are ``INVALID_ARGUMENTS`` before any tool code
  runs, a response over it is ``RESPONSE_TOO_LARGE`` in its place; either way the episode goes on.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from envace.protocol.parse import CallError
from envace.protocol.strict_json import JSONRejected, check_value
from envace.types import JSON, Task, ToolCall, ToolSchema, error_observation

# env kind -> "module:Class". Config data, never model output.
ENVIRONMENTS: dict[str, str] = {
    "bfcl": "envace.envs.bfcl:BFCLEnvironment",
    "tau2": "envace.envs.tau2:Tau2Environment",
    "mcp": "envace.envs.mcp:MCPEnvironment",  # a stdio or streamable-HTTP MCP server (docs/own-tools.md)
    "python": "envace.envs.pytools:PythonToolsEnvironment",  # plain functions or a TRL environment class
}

DEFAULT_CALL_TIMEOUT_S = 5.0
MAX_ARGUMENT_DEPTH = 64  # tool arguments nest a few levels; deep copies recurse twice per level
MAX_ARGUMENT_INT_DIGITS = 4000  # as the strict JSON reader: below Python's int-to-text limit (4,300)
MAX_RESPONSE_DEPTH = 100
EXECUTION_ERROR = "EXECUTION_ERROR"
TIMEOUT = "TIMEOUT"
ENVIRONMENT_BROKEN = "ENVIRONMENT_BROKEN"
RESPONSE_TOO_LARGE = "RESPONSE_TOO_LARGE"
_INT_LIMIT = 10**MAX_ARGUMENT_INT_DIGITS


@dataclasses.dataclass(frozen=True)
class SizeBounds:
    """The most bytes (UTF-8 JSON) one call's arguments and one response may take.

    Args:
        max_argument_bytes: arguments over this are ``INVALID_ARGUMENTS`` (no tool code runs).
        max_response_bytes: a response over this is ``RESPONSE_TOO_LARGE`` in its place.
    """

    max_argument_bytes: int = 65_536
    max_response_bytes: int = 1_048_576

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            size = getattr(self, field.name)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"{field.name} must be a positive integer (bytes), got {size!r}")

    @classmethod
    def of(cls, env: Mapping[str, Any] | None) -> SizeBounds:
        """The bounds ``task.env`` sets (its ``max_argument_bytes``, ``max_response_bytes``), else the defaults.

        >>> SizeBounds.of({"kind": "mcp", "max_response_bytes": 4096})
        SizeBounds(max_argument_bytes=65536, max_response_bytes=4096)
        """
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{k: v for k, v in (env or {}).items() if k in names})


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (as a prompt would hold it, near enough).

    >>> json_size({"a": "é"})  # {"a":"é"}: 9 characters, é two bytes
    10
    """
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace"))


class CallTimeout(Exception):
    """A call did not finish within its deadline (its worker thread was abandoned)."""


def call_with_deadline(fn: Callable[[], Any], timeout_s: float) -> Any:
    """``fn()`` run in a daemon thread, waited on for ``timeout_s`` seconds; its exception re-raised here.

    A thread, not a process: BFCL's API objects and tau2's database are Python objects the call must
    mutate in place, so a subprocess would lose the state (or need it copied back and forth). A
    thread cannot be killed, only abandoned: past the deadline :class:`CallTimeout` is raised, the
    thread is left to finish on its own (a daemon: it never holds up the interpreter's exit), and
    the caller must treat the state as unknown from then on (:meth:`Environment.guarded` does).

    The deadline holds for anything that returns to the interpreter (Python loops, sleeps, I/O); a
    single C call that keeps the GIL (``9 ** 9 ** 9``, a huge ``Decimal`` precision) blocks this thread
    too and cannot be cut short by any thread. Those are bounded where they are known, before the
    call: :mod:`envace.envs.safe_calc` for tau2's ``calculate``, the argument guards of
    :mod:`envace.envs.bfcl` for BFCL's ``MathAPI``.
    """
    outcome: list[tuple[bool, Any]] = []

    def work() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller, which decides what to do with it
            outcome.append((False, exc))

    worker = threading.Thread(target=work, name="envace-tool-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive() or not outcome:
        raise CallTimeout(f"no answer within {timeout_s:g} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def unusable_arguments(arguments: Any, depth: int = MAX_ARGUMENT_DEPTH) -> str | None:
    """Why ``arguments`` must not reach a tool, or ``None`` when they may (``depth``: the deepest nesting).

    >>> unusable_arguments({"a": [1, "x", {"b": 2.5}]}) is None
    True
    >>> for bad in ({"x": float("nan")}, {"x": "\\ud800"}, {"x": 10**5000}, {"x": [[[[1]]]]}, [1]):
    ...     print(unusable_arguments(bad, depth=3)[:44])
    nan is not a finite number
    a string holds an unpaired surrogate (surrog
    an integer of more than 4000 digits
    nested deeper than 3 levels
    arguments must be a JSON object, not list
    """
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, not {type(arguments).__name__}"
    try:
        check_value(arguments, depth=depth)
    except JSONRejected as exc:
        return str(exc)
    stack: list[Any] = [arguments]
    while stack:  # nesting is bounded now; look for integers too long to ever be printed
        item = stack.pop()
        if isinstance(item, int) and abs(item) >= _INT_LIMIT:
            return f"an integer of more than {MAX_ARGUMENT_INT_DIGITS} digits"
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def json_safe(value: Any, _depth: int = 0) -> JSON:
    """``value`` as plain JSON that serialises with ``allow_nan=False`` and encodes as UTF-8.

    Lone surrogates become U+FFFD, non-finite floats their name (``"nan"``, as BFCL's state view
    writes them), integers too long to print a marker, tuples lists, keys strings, anything else its
    ``str``; containers nested deeper than :data:`MAX_RESPONSE_DEPTH` a marker.

    >>> json_safe({"e": "bad \\udc80 byte", "x": float("inf"), 1: (2, None), 10**5000: 10**5000})
    {'e': 'bad \\ufffd byte', 'x': 'inf', '1': [2, None], '<integer of 16610 bits>': '<integer of 16610 bits>'}
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < _INT_LIMIT else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict | list | tuple) and _depth >= MAX_RESPONSE_DEPTH:
        return f"<nested deeper than {MAX_RESPONSE_DEPTH} levels>"
    if isinstance(value, dict):
        return {_key(k): json_safe(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v, _depth + 1) for v in value]
    return _text(str(value))


def _key(key: Any) -> str:
    return _text(key) if isinstance(key, str) else str(json_safe(key))


def _text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (Python strings hold no valid pairs)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


class Environment(ABC):
    """A live, stateful environment for one episode.

    Args:
        call_timeout_s: the deadline of one call, in seconds (see :meth:`guarded`).
    """

    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    bounds: SizeBounds = SizeBounds()
    _broken_by: str | None = None

    def __init__(self, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        if not call_timeout_s > 0:
            raise ValueError(f"call_timeout_s must be positive, got {call_timeout_s!r}")
        self.call_timeout_s = call_timeout_s
        self._broken_by = None

    @abstractmethod
    def tools(self) -> list[ToolSchema]:
        """Schemas of the tools this environment executes."""

    @abstractmethod
    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        """Run one call; failures come back as ``{"error": {"code", "message"}}``, never raised.

        Model-written calls are always validated; ``validate=False`` is only for replaying a
        benchmark's own gold, which the official harness executes without a schema check.
        Implementations run the call through :meth:`guarded`.
        """

    @abstractmethod
    def snapshot(self) -> JSON:
        """A JSON view of the state, for comparing two environments."""

    @property
    def broken(self) -> bool:
        """Whether a call ran past its deadline: the state is unknown and no further call runs."""
        return self._broken_by is not None

    def guarded(self, call: ToolCall, run: Callable[[], JSON]) -> JSON:
        """``run()`` (the dispatch of ``call``) behind the boundary of the module docstring."""
        if self._broken_by is not None:
            message = f"{self._broken_by!r} ran past its deadline earlier; this environment runs no more calls"
            return json_safe(error_observation(ENVIRONMENT_BROKEN, message))
        reason = unusable_arguments(call.arguments)
        size, limit = (json_size(call.arguments), self.bounds.max_argument_bytes) if reason is None else (0, 1)
        if size > limit:
            reason = f"arguments of {size} bytes, over the bound of {limit} (max_argument_bytes)"
        if reason is not None:
            return json_safe(error_observation(CallError.INVALID_ARGUMENTS, f"{call.name}: {reason}"))
        try:
            response = call_with_deadline(run, self.call_timeout_s)
        except CallTimeout as exc:
            self._broken_by = call.name
            response = error_observation(TIMEOUT, f"{call.name}: {exc}; the environment is broken from now on")
        except Exception as exc:  # our dispatch or the tool's code: never an exception to the caller
            response = error_observation(EXECUTION_ERROR, f"{call.name}: {type(exc).__name__}: {exc}")
        return self.bounded(call.name, json_safe(response))

    def bounded(self, name: str, response: JSON) -> JSON:
        """``response``, or ``RESPONSE_TOO_LARGE`` in its place when it is over ``max_response_bytes``."""
        size, limit = json_size(response), self.bounds.max_response_bytes
        if size <= limit:
            return response
        why = f"{name}: a response of {size} bytes, over the bound of {limit} (max_response_bytes)"
        return error_observation(RESPONSE_TOO_LARGE, why)

    def set_turn(self, turn: int) -> None:  # noqa: B027 - optional hook
        """Tell the environment the conversation reached user turn ``turn`` (tools may appear)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the environment holds."""


def make_environment(task: Task, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> Environment | None:
    """Build a fresh real environment for ``task``, or ``None`` when it has none.

    Args:
        task: the task (``task.env`` says which environment).
        call_timeout_s: the deadline of one call (:attr:`Environment.call_timeout_s`).
    """
    if not task.env:
        return None
    kind = task.env["kind"]
    if kind not in ENVIRONMENTS:
        raise ValueError(f"task {task.id}: unknown environment kind {kind!r}; known: {sorted(ENVIRONMENTS)}")
    module, cls = ENVIRONMENTS[kind].split(":")
    env_cls = getattr(importlib.import_module(module), cls)
    env: Environment = env_cls.from_task(task, call_timeout_s=call_timeout_s)
    try:
        env.bounds = SizeBounds.of(task.env)
    except ValueError as exc:
        env.close()
        raise ValueError(f"task {task.id}: env.{exc}") from None
    return env
