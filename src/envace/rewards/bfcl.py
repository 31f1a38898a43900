"""BFCL rewards without an environment (docs/design.md §3.5).

* :func:`bfcl_single_turn` — bfcl-eval's own ``ast_checker`` on the episode's calls (the official
  single-turn score); irrelevance categories succeed with no call, ``live_relevance`` with any call.
* :func:`bfcl_multi_turn` — an env-free proxy of the multi-turn score, which is state-based: per
  user turn, the gold calls must appear among the turn's calls with equal names and equivalent
  arguments (:func:`calls_equivalent`), in the gold's order wherever the order can matter, and no
  other call may change state that the official checker compares (a write with other arguments, a
  second order or tweet), by the static per-tool table :mod:`envace.rewards.bfcl_effects`. A read
  made in an earlier turn may stand for a gold call, as the checker's results check allows. The
  official multi-turn checker executes both and needs the environment; the validation loop runs it,
  the training reward does not. Its agreement with the official checker is measured by
  ``scripts/reward_agreement.py`` (``docs/rewards.md``).

The calls of an episode are the ``tool_calls`` of its assistant messages (``traj.calls`` when no
message carries any). Multi-turn turns are delimited by user messages: the rollout writes one user
message per entry of ``task.user_turns`` (BFCL's empty ``missed_function`` turns included, as the
BFCL source gives them a text), and calls before the first user message count for turn 0.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from envace._bfcl import bfcl_data_dir, bfcl_module
from envace.rewards.base import RewardOutput
from envace.rewards.bfcl_effects import (
    Effects,
    call_effects,
    conflict,
    meets,
    non_idempotent,
    observable,
    overwrites,
    public,
    refused_when_repeated,
)
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


@dataclass(frozen=True)
class _Step:
    """One call of the episode with what the reward knows of it: its user turn, API class ("" for a
    tool of no known class), schema and (reads, writes) (:func:`~envace.rewards.bfcl_effects.call_effects`)."""

    turn: int
    call: ToolCall
    cls: str
    schema: ToolSchema | None
    effects: Effects | None

    def conflicts(self, other: _Step) -> bool:
        return self.cls == other.cls and conflict(self.cls, self.call, other.call)

    def changes(self) -> frozenset[str]:
        """The observable state it may write (everything when unknown)."""
        if self.effects is None:
            return frozenset({"*"})
        return frozenset(k for k in self.effects[1] if observable(self.cls, k))


def _place(
    gold: list[ToolCall], calls: list[ToolCall], schemas: dict[str, ToolSchema], owner: dict[str, str]
) -> list[int] | None:
    """Where each gold call is matched: its own equivalent call, two gold calls that may not be swapped
    (same API class, :func:`~envace.rewards.bfcl_effects.conflict`) in the gold's order; ``None``
    when no such matching exists.

    Gold calls are placed in order, each at the earliest free equivalent call after its ordered
    predecessors; this greedy choice is exact (an earlier place only relaxes later bounds, and gold
    calls that compete for one call are the same call, with the same order constraints).
    """
    used: set[int] = set()
    places: list[int] = []
    for j, g in enumerate(gold):
        cls = owner.get(g.name, "")
        before = [i for i in range(j) if owner.get(gold[i].name, "") == cls and conflict(cls, gold[i], g)]
        low = max((places[i] + 1 for i in before), default=0)
        schema = schemas.get(g.name)
        at = next((k for k in range(low, len(calls)) if k not in used and calls_equivalent(g, calls[k], schema)), None)
        if at is None:
            return None
        used.add(at)
        places.append(at)
    return places


def _embeds(gold: list[ToolCall], calls: list[ToolCall], schemas: dict[str, ToolSchema], owner: dict[str, str]) -> bool:
    """Whether :func:`_place` finds a matching."""
    return _place(gold, calls, schemas, owner) is not None


def _carries(steps: list[_Step], k: int, end: int, user: dict[int, int]) -> bool:
    """Whether an earlier call ``steps[k]`` can stand for a gold call of the turn starting at ``end``,
    as the official checker's results check allows (it looks for a turn's gold results among all
    results so far): it writes nothing the state check compares, and it commutes with every call
    after it up to the turn, so its result and effect are those the gold call has there. A read may
    stand for several gold calls; a call with a (private) effect for one."""
    step = steps[k]
    if step.effects is None or any(public(key) for key in step.effects[1]):
        return False
    if step.changes() and k in user:
        return False
    return not any(step.conflicts(steps[j]) for j in range(k + 1, end))


def _no_ops(steps: list[_Step]) -> list[bool]:
    """Per call, whether it repeats an earlier equivalent call of an idempotent tool with nothing in
    between that writes what it reads or writes: it then finds the state that call left, and changes
    nothing. Calls that are no-ops themselves are not "in between". What a call writes counts as
    touched unless a repeat is refused (:func:`~envace.rewards.bfcl_effects.refused_when_repeated`:
    it writes nothing), and the order in which entries were added (``root+``) never does: a
    file-system call adds an entry only when the entry it names (which it reads) is missing.
    """
    out: list[bool] = []
    for k, step in enumerate(steps):
        out.append(False)
        if step.effects is None or non_idempotent(step.cls, step.call.name):
            continue
        reads, writes = step.effects
        touched = reads if refused_when_repeated(step.cls, step.call.name) else reads | writes - {"root+"}
        for e in range(k - 1, -1, -1):
            other = steps[e]
            if other.cls != step.cls or out[e]:
                continue
            if calls_equivalent(other.call, step.call, step.schema):
                out[k] = True
                break
            if other.effects is None or meets(other.effects[1], touched):
                break
    return out


def _overwritten(steps: list[_Step], k: int, user: dict[int, int]) -> bool:
    """Whether a later call of the same turn that stands for a gold call undoes what ``steps[k]``
    wrote (:func:`~envace.rewards.bfcl_effects.overwrites`), with no call in between reading it."""
    step, changed = steps[k], steps[k].changes()
    for j in range(k + 1, len(steps)):
        later = steps[j]
        if later.turn != step.turn:
            return False
        if later.cls != step.cls:
            continue
        if user.get(j) == step.turn and overwrites(step.cls, step.call, later.call):
            return True
        if later.effects is None or meets(changed, later.effects[0]):
            return False
    return False


def _harm(steps: list[_Step], k: int, user: dict[int, int], no_op: list[bool]) -> str:
    """Why an extra call (matched by no gold call) fails its turn, or "" when it is harmless: it may
    change the state the checker compares (a write with other arguments than the gold's, a second
    tweet), or private state a later call reads (a ``cd`` before more file operations). Extra reads,
    exact repeats of idempotent calls (:func:`_no_ops`) and writes that a gold call of the turn
    overwrites (:func:`_overwritten`) are harmless."""
    step = steps[k]
    changed = step.changes()
    if not changed or no_op[k] or _overwritten(steps, k, user):
        return ""
    shown = f"{step.call.name}({', '.join(f'{a}={v!r}' for a, v in step.call.arguments.items())})"
    if step.effects is None:
        return f"extra call of a tool with unknown effects: {shown}"
    if any(public(key) for key in changed):
        return f"extra call that changes the state: {shown}"
    later = [s for s in steps[k + 1 :] if s.cls == step.cls]
    if any(s.effects is None or meets(changed, s.effects[0]) for s in later):
        return f"extra call whose effect a later call reads: {shown}"
    return ""


def turn_failures(
    gold: list[list[ToolCall]],
    turns: list[list[ToolCall]],
    schemas: list[dict[str, ToolSchema]],
    owner: dict[str, str],
) -> list[str]:
    """Per gold turn, "" when it passes, else why it fails (see :func:`bfcl_multi_turn`).

    Args:
        gold: the gold calls per user turn.
        turns: the episode's calls per user turn (turns it never reached are missing).
        schemas: per turn, the visible tools by name.
        owner: tool name -> API class.
    """
    turns = turns[: len(gold)]
    steps = [
        _Step(t, c, owner.get(c.name, ""), schemas[t].get(c.name), call_effects(owner.get(c.name, ""), c))
        for t, calls in enumerate(turns)
        for c in calls
    ]
    bounds = [0, *itertools.accumulate(map(len, turns))]
    user: dict[int, int] = {}  # step -> the first turn whose gold call it stands for
    why: list[str] = []
    for t, calls in enumerate(gold):
        if t >= len(turns):
            why.append("turn not reached")
            continue
        own = list(range(bounds[t], bounds[t + 1]))
        if not calls or not own:  # the checker fails a turn with gold calls and no call at all
            why.append(("" if not own else "a call in a turn whose gold is empty") if not calls else "no call")
            continue
        pool = own
        places = _place(calls, [steps[k].call for k in pool], schemas[t], owner)
        if places is None:  # calls made in an earlier turn may stand for some gold calls
            pool = [k for k in range(bounds[t]) if _carries(steps, k, bounds[t], user)] + own
            places = _place(calls, [steps[k].call for k in pool], schemas[t], owner)
        if places is None:
            why.append("a gold call is missing, or out of an order that matters")
            continue
        for p in places:
            user.setdefault(pool[p], t)
        why.append("")
    no_op = _no_ops(steps)
    for t, calls in enumerate(gold):  # extra calls, once every turn has taken what it stands for
        if calls and not why[t]:
            extra = (k for k in range(bounds[t], bounds[t + 1]) if k not in user)
            why[t] = next(filter(None, (_harm(steps, k, user, no_op) for k in extra)), "")
    return why


def bfcl_multi_turn(task: Task, traj: Trajectory) -> RewardOutput:
    """Mean over user turns of "the turn leaves the state and results its gold leaves", judged from
    the calls alone (:func:`turn_failures`; API classes from ``task.env["involved_classes"]``):

    * every gold call is matched to its own equivalent call (:func:`calls_equivalent`), in the gold's
      order where two calls do not commute (:func:`~envace.rewards.bfcl_effects.conflict`); a call
      made in an earlier turn may stand for one when it changes no compared state and commutes with
      everything since (:func:`_carries`);
    * no other call may change what the official checker compares (:func:`_harm`): a write with
      other arguments, a second order or tweet, a ``cd`` before more file operations fail the turn;
      reads and exact repeats of idempotent calls do not;
    * a turn whose gold is empty passes only without calls.

    ``details["turns"]`` holds the per-turn flags, ``details["failures"]`` why each failing turn
    fails; ``success`` is True when every turn passes. Turns the episode never reached fail; user
    messages beyond ``task.gold`` are ignored and counted in ``details["extra_turns"]``. A task
    without gold is masked.
    """
    if not task.gold:
        return RewardOutput(None, False, {"error": f"task {task.id} has no gold calls"})
    per_turn = calls_per_turn(traj.messages)
    owner = tool_classes(tuple((task.env or {}).get("involved_classes") or ()))
    schemas = [{str(t.get("function", t)["name"]): t for t in task.tools_at(i)} for i in range(len(task.gold))]
    why = turn_failures(task.gold, per_turn, schemas, owner)
    flags = [not w for w in why]
    details = {
        "turns": flags,
        "failures": [f"turn {t}: {w}" for t, w in enumerate(why) if w],
        "extra_turns": max(0, len(per_turn) - len(task.gold)),
        "n_calls": sum(len(t) for t in per_turn),
    }
    return RewardOutput(sum(flags) / len(flags), all(flags), details)
