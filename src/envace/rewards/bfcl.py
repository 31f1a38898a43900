"""BFCL rewards without an environment (docs/design.md §3.5).

* :func:`bfcl_single_turn` — bfcl-eval's own ``ast_checker`` on the episode's calls (the official
  single-turn score); irrelevance categories succeed with no call, ``live_relevance`` with any call.
* :func:`bfcl_multi_turn` — an env-free proxy of the multi-turn score: per user turn, the gold calls
  must appear among the turn's calls with equal names and equivalent arguments
  (:func:`calls_equivalent`), in the gold's order wherever the order can matter (two calls on one
  API class that do not commute, by the static per-tool table :mod:`envace.rewards.bfcl_effects`),
  and no call of a non-idempotent tool may be repeated beyond the gold. The official multi-turn
  checker compares environment states and needs the environment; the validation loop runs it, the
  training reward does not. Its agreement with the official checker is measured by
  ``scripts/reward_agreement.py`` (``docs/rewards.md``).

The calls of an episode are the ``tool_calls`` of its assistant messages (``traj.calls`` when no
message carries any). Multi-turn turns are delimited by user messages: the rollout writes one user
message per entry of ``task.user_turns`` (BFCL's empty ``missed_function`` turns included, as the
BFCL source gives them a text), and calls before the first user message count for turn 0.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from typing import Any

from envace._bfcl import bfcl_data_dir, bfcl_module
from envace.rewards.base import RewardOutput
from envace.rewards.bfcl_effects import non_idempotent, ordered, reads, writes
from envace.types import Message, Task, ToolCall, ToolSchema, Trajectory

_MISSING = object()


def episode_calls(traj: Trajectory) -> list[ToolCall]:
    """Every call of the episode in order: assistant ``tool_calls``, else ``traj.calls``."""
    calls = [c for m in traj.messages if m.role == "assistant" for c in m.tool_calls]
    return calls or [r.call for r in traj.calls]


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
    """bfcl-eval's ``ast_checker`` verdict on the episode's calls: score 1.0 or 0.0.

    Reads ``task.category`` (the checker picks simple / multiple / parallel by it),
    ``task.extra["possible_answer"]`` (the ground truth list of the record) and
    ``task.extra.get("language", "python")``. A task without a possible answer is masked
    (``score=None``); a checker exception on the model's values counts as invalid output.
    """
    calls = episode_calls(traj)
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


# --------------------------------------------------------------------------- multi turn


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


def _embeds(gold: list[ToolCall], calls: list[ToolCall], schemas: dict[str, ToolSchema], owner: dict[str, str]) -> bool:
    """Each gold call is matched to its own equivalent call, and two gold calls whose order can matter
    (same API class, :func:`~envace.rewards.bfcl_effects.ordered`) are matched in the gold's order.

    Gold calls are placed in order, each at the earliest free equivalent call after its ordered
    predecessors; this greedy choice is exact (an earlier place only relaxes later bounds, and gold
    calls that compete for one call are the same call, with the same order constraints).
    """
    used: set[int] = set()
    places: list[int] = []
    for j, g in enumerate(gold):
        cls = owner.get(g.name, "")
        low = max((places[i] + 1 for i in range(j) if _ordered(cls, owner, gold[i].name, g.name)), default=0)
        schema = schemas.get(g.name)
        at = next((k for k in range(low, len(calls)) if k not in used and calls_equivalent(g, calls[k], schema)), None)
        if at is None:
            return False
        used.add(at)
        places.append(at)
    return True


def _ordered(cls: str, owner: dict[str, str], a: str, b: str) -> bool:
    return owner.get(a, "") == cls and ordered(cls, a, b)


def _repeats(calls: list[ToolCall], schemas: dict[str, ToolSchema], owner: dict[str, str]) -> Counter[str]:
    """Per tool, the calls of a non-idempotent tool that repeat an earlier equivalent call with nothing
    in between that writes what the tool reads (after such a call, a repeat may be a retry)."""
    out: Counter[str] = Counter()
    for j, call in enumerate(calls):
        cls = owner.get(call.name, "")
        if not non_idempotent(cls, call.name):
            continue
        inputs = reads(cls, call.name) or frozenset()
        for before in reversed(calls[:j]):
            if calls_equivalent(before, call, schemas.get(call.name)):
                out[call.name] += 1
                break
            changed = writes(cls, before.name) if owner.get(before.name, "") == cls else frozenset()
            if changed is None or changed & inputs:
                break
    return out


def _turn_passes(
    gold: list[ToolCall], calls: list[ToolCall], schemas: dict[str, ToolSchema], owner: dict[str, str] | None = None
) -> bool:
    """The gold calls are embedded in the turn's calls (:func:`_embeds`: order kept only where it can
    matter), and no call of a non-idempotent tool is repeated more often than the gold repeats it
    (:func:`_repeats`: a second order or booking is not harmless). An empty gold turn passes only
    without calls. ``owner`` maps tool names to API classes; tools without one keep the gold order.
    """
    if not gold:
        return not calls
    owner = owner or {}
    if not _embeds(gold, calls, schemas, owner):
        return False
    allowed = _repeats(gold, schemas, owner)
    return all(n <= allowed[name] for name, n in _repeats(calls, schemas, owner).items())


def bfcl_multi_turn(task: Task, traj: Trajectory) -> RewardOutput:
    """Mean over user turns of "the turn's gold calls appear among its calls, in the gold's order
    where it can matter, and no side effect is repeated" (:func:`_turn_passes`; API classes from
    ``task.env["involved_classes"]``).

    ``details["turns"]`` holds the per-turn flags; ``success`` is True when every turn passes.
    Turns the episode never reached (fewer user messages than ``task.gold``) fail; user messages
    beyond ``task.gold`` are ignored and counted in ``details["extra_turns"]``. A task without
    gold is masked.
    """
    if not task.gold:
        return RewardOutput(None, False, {"error": f"task {task.id} has no gold calls"})
    per_turn = calls_per_turn(traj.messages)
    owner = tool_classes(tuple((task.env or {}).get("involved_classes") or ()))
    flags = []
    for i, gold in enumerate(task.gold):
        schemas = {str(t.get("function", t)["name"]): t for t in task.tools_at(i)}
        calls = per_turn[i] if i < len(per_turn) else []
        flags.append(i < len(per_turn) and _turn_passes(gold, calls, schemas, owner))
    score = sum(flags) / len(flags)
    details = {
        "turns": flags,
        "extra_turns": max(0, len(per_turn) - len(task.gold)),
        "n_calls": sum(len(t) for t in per_turn),
    }
    return RewardOutput(score, all(flags), details)
