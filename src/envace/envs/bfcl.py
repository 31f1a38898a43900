"""BFCL-v4 multi-turn API classes as a real :class:`~envace.envs.base.Environment`.

Each involved class (``GorillaFileSystem``, ``TwitterAPI``, ...) comes from bfcl-eval's
``eval_checker/multi_turn_eval/func_source_code`` and is loaded with the task's initial
configuration exactly as bfcl-eval's ``execute_multi_turn_func_call`` does (a deep copy of the
class's config, ``long_context`` passed through, stateless classes left unconfigured). Unlike
bfcl-eval, nothing is ``eval``-ed: a call is validated against the tools visible at the current
turn, then dispatched by name to the public method of the class that owns it. Only names that
appear in the task's tool docs *and* are public methods of an involved class can be called.

The memory backends (``MemoryAPI_kv``, ``MemoryAPI_rec_sum``) keep bfcl-eval's snapshot files: their
config names a results folder, the entry id and its scenario; a prerequisite conversation starts
from its scenario's latest snapshot and writes it back when the environment closes (bfcl-eval's
runner flushes at the end of every ``*_prereq_*`` conversation); a question only reads it. See
:mod:`envace.evaluation.bfcl_memory`.

Every call runs behind :meth:`Environment.guarded <envace.envs.base.Environment.guarded>` (argument
checks, a deadline, a JSON-safe answer). The API objects are mutated in place, so the call runs in an
abandonable thread, not a subprocess; a call that times out leaves the environment broken. Four
``MathAPI`` methods can spend minutes inside one C call that keeps the GIL, which no thread deadline
interrupts, so their arguments are bounded first (:data:`ARGUMENT_GUARDS`): ``power`` of two
integers (:func:`envace.envs.safe_calc.check_power`), the ``precision`` of ``logarithm`` (mpmath)
and ``square_root`` (``decimal``), and the ``decimal_places`` of ``round_number``.
"""

from __future__ import annotations

import copy
import datetime
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace._bfcl import bfcl_module
from envace.envs.base import DEFAULT_CALL_TIMEOUT_S, EXECUTION_ERROR, Environment
from envace.envs.safe_calc import CalculationLimit, check_power
from envace.protocol.parse import CallError, tool_name, validate_call
from envace.types import JSON, Task, ToolCall, ToolSchema, error_observation

MAX_PRECISION = 1000  # digits; bfcl's gold asks for at most 10


def to_json(value: Any, _path: tuple[int, ...] = ()) -> JSON:
    """A JSON view of a Python value: objects become their public attributes, the rest ``str``.

    Objects are expanded to ``{"__class__": name, <public attributes>}``; an object that is already
    being expanded higher up (``Directory.parent``) becomes a short ``"<Class (cycle)>"`` marker.

    >>> to_json({1: (2.5, {"a"}), "t": datetime.date(2024, 1, 2), "x": float("nan")})
    {'1': [2.5, ['a']], 't': '2024-01-02', 'x': 'nan'}
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): to_json(v, _path) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v, _path) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((to_json(v, _path) for v in value), key=str)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if hasattr(value, "__dict__"):
        if id(value) in _path:
            return f"<{type(value).__name__} (cycle)>"
        inner = (*_path, id(value))
        state = {k: to_json(v, inner) for k, v in vars(value).items() if not k.startswith("_")}
        return {"__class__": type(value).__name__, **state}
    return str(value)


def public_state(instance: Any) -> dict[str, JSON]:
    """The attributes bfcl-eval's state checker compares (``vars`` minus ``_private``), as JSON."""
    return {k: to_json(v) for k, v in vars(instance).items() if not k.startswith("_")}


def load_instance(class_name: str, initial_config: dict[str, Any], long_context: bool = False) -> Any:
    """A fresh, configured instance of one BFCL API class (as ``execute_multi_turn_func_call`` builds it).

    Args:
        class_name: a key of bfcl-eval's ``CLASS_FILE_PATH_MAPPING`` (``"GorillaFileSystem"``, ...).
        initial_config: the task's ``initial_config`` (all classes); this class's part is deep-copied.
        long_context: passed to ``_load_scenario`` (``multi_turn_long_context`` tasks).
    """
    backend = bfcl_module("constants.executable_backend_config")
    if class_name not in backend.CLASS_FILE_PATH_MAPPING:
        raise ValueError(f"unknown BFCL class {class_name!r}; known: {sorted(backend.CLASS_FILE_PATH_MAPPING)}")
    module_name = backend.CLASS_FILE_PATH_MAPPING[class_name].removeprefix("bfcl_eval.")
    instance = getattr(bfcl_module(module_name), class_name)()
    if class_name not in backend.STATELESS_CLASSES:
        config = copy.deepcopy(initial_config.get(class_name, {}))
        if class_name.startswith("MemoryAPI"):
            if not config.get("model_result_dir"):
                raise ValueError(f"{class_name} needs 'model_result_dir', the folder of its memory snapshots")
            config["model_result_dir"] = Path(config["model_result_dir"])  # a str in the task's JSON
        instance._load_scenario(config, long_context=long_context)
    return instance


def is_memory_prereq(instance: Any) -> bool:
    """A memory backend loaded for a prerequisite conversation (its memory is written back at the end)."""
    return hasattr(instance, "_flush_memory_to_local_file") and "prereq" in str(getattr(instance, "test_id", ""))


def _bounded_power(arguments: dict[str, Any]) -> None:
    check_power(arguments.get("base"), arguments.get("exponent"))


def _bounded_digits(name: str) -> Callable[[dict[str, Any]], None]:
    """A guard on a count of digits (a precision, decimal places): at most :data:`MAX_PRECISION` either way."""

    def guard(arguments: dict[str, Any]) -> None:
        digits = arguments.get(name)
        if isinstance(digits, int | float) and abs(digits) > MAX_PRECISION:
            raise CalculationLimit(f"{name} {digits} is over {MAX_PRECISION} digits")

    return guard


# (class, method) -> a check of the arguments that raises CalculationLimit: each of these methods can
# otherwise spend minutes in one GIL-holding C call (int ** int, mpmath or decimal at a huge
# precision, round(5, -10**9) computing 10 ** 10**9)
ARGUMENT_GUARDS: dict[tuple[str, str], Callable[[dict[str, Any]], None]] = {
    ("MathAPI", "power"): _bounded_power,
    ("MathAPI", "logarithm"): _bounded_digits("precision"),
    ("MathAPI", "square_root"): _bounded_digits("precision"),
    ("MathAPI", "round_number"): _bounded_digits("decimal_places"),
}


def _guard_refusal(class_name: str, call: ToolCall) -> JSON | None:
    """``INVALID_ARGUMENTS`` when the call's guard (if it has one) refuses its arguments."""
    guard = ARGUMENT_GUARDS.get((class_name, call.name))
    try:
        if guard is not None:
            guard(call.arguments)
    except CalculationLimit as exc:
        return error_observation(CallError.INVALID_ARGUMENTS, f"{call.name}: {exc}")
    return None


def _response(result: Any) -> JSON:
    """A method's return value as a tool response; scalars and ``None`` are wrapped in ``{"result": ...}``."""
    value = to_json(result)
    return value if isinstance(value, dict | list) else {"result": value}


class BFCLEnvironment(Environment):
    """The live API instances of one BFCL multi-turn task.

    Args:
        initial_config: the task's ``initial_config``.
        involved_classes: class names, in the task's order (a method defined by two classes goes to
            the later one, as in bfcl-eval).
        tools: tool docs visible from the first turn.
        tools_added: docs that become visible at a turn (``{"3": [doc, ...]}``; BFCL ``missed_function``).
        long_context: load the long-context variant of each scenario.
        call_timeout_s: the deadline of one call, in seconds.
    """

    def __init__(
        self,
        initial_config: dict[str, Any],
        involved_classes: list[str],
        tools: list[ToolSchema],
        tools_added: dict[str, list[ToolSchema]] | None = None,
        long_context: bool = False,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        super().__init__(call_timeout_s)
        self._instances = {c: load_instance(c, initial_config, long_context) for c in involved_classes}
        self._task = Task(id="", benchmark="bfcl", tools=list(tools), tools_added=dict(tools_added or {}))
        self._turn = 0
        all_names = {tool_name(t) for t in self._task.tools_at(10**9)}
        self._owner: dict[str, str] = {}
        for class_name, instance in self._instances.items():
            for name in all_names:
                if not name.startswith("_") and callable(getattr(type(instance), name, None)):
                    self._owner[name] = class_name

    @classmethod
    def from_task(cls, task: Task, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> BFCLEnvironment:
        """Build the environment of a BFCL multi-turn task (``task.env["kind"] == "bfcl"``)."""
        if not task.env or task.env.get("kind") != "bfcl":
            raise ValueError(f"task {task.id}: not a BFCL multi-turn task (env={task.env!r})")
        return cls(
            initial_config=task.env.get("initial_config") or {},
            involved_classes=list(task.env["involved_classes"]),
            tools=task.tools,
            tools_added=task.tools_added,
            long_context=bool(task.env.get("long_context", False)),
            call_timeout_s=call_timeout_s,
        )

    def set_turn(self, turn: int) -> None:
        """Move to user turn ``turn`` (0-based): tools added at or before it become visible."""
        self._turn = turn

    def tools(self) -> list[ToolSchema]:
        """The tool docs visible at the current turn."""
        return self._task.tools_at(self._turn)

    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        """Validate ``call`` against the visible tools, run it, and return its JSON response or error.

        ``validate=False`` is for the benchmark's own gold (trusted data): it skips the argument
        schema and turn-visibility checks as the official harness does; dispatch stays whitelisted,
        and the boundary (:meth:`~envace.envs.base.Environment.guarded`) stays in place.
        """
        return self.guarded(call, lambda: self._dispatch(call, validate))

    def _dispatch(self, call: ToolCall, validate: bool) -> JSON:
        """The call itself (runs in :meth:`guarded`'s worker thread)."""
        invalid = validate_call(call, self.tools()) if validate else None
        if invalid is not None:
            return invalid
        class_name = self._owner.get(call.name)
        if class_name is None:
            return error_observation("UNKNOWN_TOOL", f"no involved class implements {call.name!r}")
        refused = _guard_refusal(class_name, call)
        if refused is not None:
            return refused
        method = getattr(self._instances[class_name], call.name)
        try:
            result = method(**copy.deepcopy(call.arguments))  # the API keeps (and later mutates) what it gets
        except Exception as exc:  # the API code is not ours: any failure becomes an observation
            return error_observation(EXECUTION_ERROR, f"{call.name}: {type(exc).__name__}: {exc}")
        return _response(result)

    def close(self) -> None:
        """End of the conversation: a memory prerequisite writes its memory snapshot (as bfcl-eval's runner)."""
        for instance in self._instances.values():
            if is_memory_prereq(instance):
                instance._flush_memory_to_local_file()

    def snapshot(self) -> JSON:
        """``{class name: public state}`` of every involved instance."""
        return {name: public_state(inst) for name, inst in self._instances.items()}

    def instances(self) -> dict[str, Any]:
        """The live API objects by class name (for tests and state comparison)."""
        return dict(self._instances)
