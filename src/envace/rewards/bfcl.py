"""The BFCL single-turn reward, and the call comparison both BFCL rewards share (docs/design.md §3.5).

* :func:`bfcl_single_turn` — bfcl-eval's own ``ast_checker`` on the calls of the episode's first act
  step (the official single-turn score, which takes the model's first response only); irrelevance
  categories succeed with no call, ``live_relevance`` with any call.
* :func:`calls_equivalent` (values compared by :func:`normalise`), :func:`calls_per_turn` and
  :func:`tool_classes` — what the env-free multi-turn reward (:mod:`envace.rewards.bfcl_turns`)
  builds on.

An act step is one assistant message, its calls the message's ``tool_calls`` (``traj.calls`` when
no message carries any). Multi-turn turns are delimited by user messages: the rollout writes one user
message per entry of ``task.user_turns`` (BFCL's empty ``missed_function`` turns included, as the
BFCL source gives them a text), and calls before the first user message count for turn 0.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from envace._bfcl import bfcl_data_dir, bfcl_module
from envace.rewards.base import RewardOutput
from envace.types import Message, Task, ToolCall, ToolSchema, Trajectory

_MISSING = object()


def first_step_calls(traj: Trajectory) -> list[ToolCall]:
    """The calls of the episode's first act step (its first assistant message); ``traj.calls`` when
    no assistant message carries any call.

    >>> ms = [Message("user", "a"), Message("assistant", tool_calls=[ToolCall("f")]), Message("tool", "{}"),
    ...       Message("assistant", tool_calls=[ToolCall("g")])]
    >>> [c.name for c in first_step_calls(Trajectory(Task(id="x", benchmark="bfcl"), ms))]
    ['f']
    """
    steps = [m for m in traj.messages if m.role == "assistant"]
    if not any(m.tool_calls for m in steps):
        return [r.call for r in traj.calls]
    return list(steps[0].tool_calls)


def calls_per_turn(messages: list[Message]) -> list[list[ToolCall]]:
    """The assistant calls between consecutive user messages; element i is user turn i.

    >>> ms = [Message("user", "a"), Message("assistant", tool_calls=[ToolCall("f")]), Message("user", "b")]
    >>> [[c.name for c in t] for t in calls_per_turn(ms)]
    [['f'], []]
    """
    turns: list[list[ToolCall]] = []
    early: list[ToolCall] = []  # calls before the first user message count for turn 0
    for m in messages:
        if m.role == "user":
            turns.append(early if not turns else [])
        elif m.role == "assistant":
            (turns[-1] if turns else early).extend(m.tool_calls)
    return turns if turns or not early else [early]


# --------------------------------------------------------------------------- single turn


@cache
def _original_docs(category: str) -> dict[str, list[dict[str, Any]]]:
    """``id -> function docs`` as bfcl-eval's checker reads them (no language hints)."""
    path = bfcl_data_dir() / f"BFCL_v4_{category}.json"
    with path.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {r["id"]: r["function"] for r in rows}


def _checker_docs(task: Task, language: str) -> list[dict[str, Any]]:
    """The function docs to check against: ``task.extra["functions"]`` when the source kept the
    originals; else ``task.tools`` for Python (BFCL's hints change only descriptions there); else
    (Java/JavaScript, whose hinted docs turn every type into ``string``) the wheel's original docs."""
    if "functions" in task.extra:
        return list(task.extra["functions"])
    if language == "python":
        return [t.get("function", t) for t in task.tools]
    return _original_docs(task.category)[task.id]


def _canonical_name(name: str, known: list[str]) -> str:
    """A called name; ``a_b`` maps back to ``a.b`` when only the dotted name is a known function
    (APIs that forbid dots in names make models write underscores)."""
    if name in known:
        return name
    dotted = [k for k in known if k.replace(".", "_") == name]
    return dotted[0] if len(dotted) == 1 else name


def _checker_calls(calls: list[ToolCall], docs: list[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    known = [str(d["name"]) for d in docs]
    return [{_canonical_name(c.name, known): dict(c.arguments)} for c in calls]


def _with_required(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A shallow copy of each doc whose ``parameters`` has ``properties`` and ``required`` (the checker
    indexes both)."""
    out = []
    for d in docs:
        params = dict(d.get("parameters") or {})
        params.setdefault("properties", {})
        params.setdefault("required", [])
        out.append({**d, "parameters": params})
    return out


def bfcl_single_turn(task: Task, traj: Trajectory) -> RewardOutput:
    """bfcl-eval's ``ast_checker`` verdict on the calls of the episode's first act step
    (:func:`first_step_calls`): score 1.0 or 0.0.

    BFCL's single-turn evaluation takes the model's first response only, so calls written in later
    act steps (after a tool response, rehearsed or real) count for nothing: parallel calls written
    one per step fail, as they fail the official checker.

    Reads ``task.category`` (the checker picks simple / multiple / parallel by it),
    ``task.extra["possible_answer"]`` (the ground truth list of the record) and
    ``task.extra.get("language", "python")``. A task without a possible answer is masked
    (``score=None``); a checker exception on the model's values counts as invalid output.
    """
    calls = first_step_calls(traj)
    category = task.category
    if "irrelevance" in category or category.endswith("relevance"):
        ok = not calls if "irrelevance" in category else bool(calls)
        return RewardOutput(float(ok), ok, {"n_calls": len(calls)})
    answer = task.extra.get("possible_answer")
    if not answer:
        return RewardOutput(None, False, {"error": f"task {task.id} has no possible_answer"})
    language = str(task.extra.get("language", "python"))
    docs = _with_required(_checker_docs(task, language))
    checker = bfcl_module("eval_checker.ast_eval.ast_checker")
    lang = bfcl_module("constants.enums").Language(language)
    try:
        verdict = checker.ast_checker(docs, _checker_calls(calls, docs), answer, lang, category, "envace")
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:  # odd model values
        verdict = {
            "valid": False,
            "error": [f"checker raised {type(exc).__name__}: {exc}"],
            "error_type": "envace:checker_exception",
        }
    ok = bool(verdict.get("valid"))
    details = {"n_calls": len(calls), "error": verdict.get("error", []), "error_type": verdict.get("error_type")}
    return RewardOutput(float(ok), ok, details)


# --------------------------------------------------------------------------- call comparison


def normalise(value: Any, prop: dict[str, Any] | None = None) -> Any:
    """A value in a form where JSON-equivalent values compare equal: numbers as floats (1 == 1.0),
    tuples as lists, booleans kept apart from numbers (``True != 1``), dict keys as strings.

    ``prop`` is the value's JSON-Schema property, when known. A float where it declares an
    ``integer`` (also inside ``items`` and ``properties``) stays apart from every int, as in
    bfcl-eval's ``ast_checker``, which accepts an int for a ``float`` but not a float for an
    ``integer``: the API stores and echoes ``4.0``, not ``4``.

    >>> normalise((1, {"a": 2.0})) == normalise([1.0, {"a": 2}]), normalise(True) == normalise(1)
    (True, False)
    >>> normalise(4.0, {"type": "integer"}) == normalise(4, {"type": "integer"}), normalise(4, {"type": "float"})
    (False, 4.0)
    """
    prop = prop if isinstance(prop, dict) else {}
    if isinstance(value, bool):
        return ("__bool__", value)
    if isinstance(value, float) and prop.get("type") == "integer":
        return ("__float_for_integer__", value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list | tuple):
        return [normalise(v, prop.get("items")) for v in value]
    if isinstance(value, dict):
        props = prop.get("properties") or {}
        return {str(k): normalise(v, props.get(k)) for k, v in value.items()}
    return value


def _properties(schema: ToolSchema | None) -> dict[str, Any]:
    fn = (schema or {}).get("function", schema or {})
    return dict((fn.get("parameters") or {}).get("properties") or {})


def _equals_default(value: Any, default: Any, prop: dict[str, Any]) -> bool:
    if normalise(value, prop) == normalise(default, prop):
        return True
    return value is None and default == "None"  # BFCL docs write a None default as the string "None"


def calls_equivalent(gold: ToolCall, call: ToolCall, schema: ToolSchema | None = None) -> bool:
    """Same name, and every argument equal after :func:`normalise` (typed by the tool's schema:
    ``4.0`` for an ``integer`` is not ``4``; ``4`` for a ``float`` is ``4.0``).

    An argument present on one side only passes when the tool's schema declares a ``default`` and
    the present value equals it (BFCL's string default ``"None"`` also equals ``null``): writing
    out a default, or omitting it, is the same call. Any other missing or extra argument fails.

    >>> s = {"name": "ls", "parameters": {"properties": {"a": {"type": "boolean", "default": False}}}}
    >>> calls_equivalent(ToolCall("ls", {"a": False}), ToolCall("ls", {}), s)
    True
    >>> calls_equivalent(ToolCall("ls", {"a": True}), ToolCall("ls", {}), s)
    False
    >>> n = {"name": "f", "parameters": {"properties": {"i": {"type": "integer"}, "x": {"type": "float"}}}}
    >>> calls_equivalent(ToolCall("f", {"i": 4, "x": 2.0}), ToolCall("f", {"i": 4, "x": 2}), n)
    True
    >>> calls_equivalent(ToolCall("f", {"i": 4, "x": 2.0}), ToolCall("f", {"i": 4.0, "x": 2.0}), n)
    False
    """
    if gold.name != call.name:
        return False
    props = _properties(schema)
    for key in set(gold.arguments) | set(call.arguments):
        g, c = gold.arguments.get(key, _MISSING), call.arguments.get(key, _MISSING)
        found = props.get(key)
        prop: dict[str, Any] = found if isinstance(found, dict) else {}
        if g is _MISSING or c is _MISSING:
            present = c if g is _MISSING else g
            if "default" not in prop or not _equals_default(present, prop["default"], prop):
                return False
        elif normalise(g, prop) != normalise(c, prop):
            return False
    return True


@cache
def tool_classes(classes: tuple[str, ...]) -> dict[str, str]:
    """``tool name -> API class`` for BFCL multi-turn classes, from bfcl-eval's per-class docs."""
    mapping = bfcl_module("constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
    owner = {}
    for class_name in classes:
        with (bfcl_data_dir() / "multi_turn_func_doc" / mapping[class_name]).open(encoding="utf-8") as fh:
            owner.update({json.loads(line)["name"]: class_name for line in fh if line.strip()})
    return owner
