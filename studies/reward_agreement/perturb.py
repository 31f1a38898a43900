"""The agreement study's perturbations: the gold of a BFCL multi-turn task with one change.

:func:`perturb` draws one edit of a kind (:data:`KINDS`; :data:`PROBES` for known differences):
a gold call edited (`perturb_calls`), dropped, duplicated, swapped or moved
to another turn, a turn's calls written twice, or a call added: a read-only one, or a write with
other arguments before, between or after the gold calls, kept only when it changes the compared
state where it runs (:func:`_changes_state` executes the script in the real environment to decide;
the reward never does). The result is a :class:`Perturbation`, the calls to write per user turn.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

from perturb_calls import (
    ARG_KINDS,
    _arg_edits,
    _equivalents,
    _other_values,
    _owner,
    _props,
    _read_only,
    _replacements,
    _valid,
    _visible,
    _writes_state,
)
from perturb_class import CLASS_KINDS, class_edits

from envace.data.sources.bfcl import call_string
from envace.rewards.bfcl import calls_equivalent
from envace.types import Task, ToolCall

Script = list[list[ToolCall]]
KINDS = (
    "gold",
    "change_arg",
    "drop_arg",
    "drop_call",
    "swap_calls",
    "extra_readonly",
    "duplicate_call",
    "replace_tool",
    "equivalent_value",
    "extra_write_before",
    "extra_write_between",
    "extra_write_after",
    "move_earlier",
    "move_later",
    "duplicate_write",
    "repeat_turn",
    "same_tool_swap",
    "arg_case",
    "arg_numeric",
    "arg_other_value",
    *CLASS_KINDS,
)
#: kinds drawn once per API class (the class of the call they copy), so that every class is probed
BY_CLASS = ("extra_write_before", "extra_write_between", "extra_write_after")
#: like them, but the added call changes nothing where it runs (refused, or redundant): a probe
PER_CLASS = (*BY_CLASS, "noop_write")
#: probes of known differences (docs/rewards.md), not in the default mix: a read-only call in an empty gold
#: turn; an ``integer`` argument written as a float (a type error to bfcl-eval's ast_checker and to our reward);
#: an extra write that changes nothing where it runs (the API refuses it, or it is redundant)
PROBES = ("call_in_empty_turn", "float_for_integer", "noop_write")


@dataclass(frozen=True)
class Perturbation:
    """The calls to write per user turn, what was changed, and (for :data:`PER_CLASS` kinds) the API
    class and place of the added call."""

    kind: str
    script: Script
    note: str
    api_class: str = ""
    #: ``(turn, index)`` of the call a :data:`PER_CLASS` kind adds
    added: tuple[int, int] | None = None


def _sites(script: Script) -> list[tuple[int, int]]:
    return [(t, i) for t, turn in enumerate(script) for i in range(len(turn))]


def _with_turn(script: Script, turn: int, calls: list[ToolCall]) -> Script:
    return [list(calls) if t == turn else list(c) for t, c in enumerate(script)]


def _turn_edits(task: Task, kind: str, t: int, i: int, rng: random.Random) -> list[tuple[list[ToolCall], str]]:
    """Candidate new versions of gold turn ``t`` that change its call ``i`` by ``kind``."""
    turn, call = task.gold[t], task.gold[t][i]
    before, after = turn[:i], turn[i + 1 :]
    if kind in ARG_KINDS:
        return [([*before, new, *after], note) for new, note in _arg_edits(task, kind, t, call, rng)]
    if kind == "drop_call":
        return [([*before, *after], "dropped")]
    if kind == "duplicate_call":
        return [([*before, call, call, *after], "duplicated")]
    if kind == "duplicate_write":  # repeated later in the turn, not right after itself
        at = list(range(i + 2, len(turn) + 1))
        if not at or not _writes_state(task, call):
            return []
        j = rng.choice(at)
        return [([*turn[:j], call, *turn[j:]], f"repeated at {j}")]
    if kind == "swap_calls":
        ok = i + 1 < len(turn) and turn[i] != turn[i + 1]
        return [([*before, turn[i + 1], call, *turn[i + 2 :]], f"swapped with {turn[i + 1].name}")] if ok else []
    if kind == "same_tool_swap":
        schema = _visible(task, t).get(call.name)
        return [
            ([*turn[:i], turn[j], *turn[i + 1 : j], call, *turn[j + 1 :]], f"swapped with call {j}")
            for j in range(i + 1, len(turn))
            if turn[j].name == call.name and not calls_equivalent(call, turn[j], schema)
        ]
    if kind == "replace_tool":
        return [([*before, new, *after], f"-> {call_string(new)}") for new in _replacements(task, t, call)]
    if kind == "equivalent_value":
        props = _props(_visible(task, t).get(call.name))
        return [([*before, new, *after], note) for new, note in _equivalents(task, t, call, props)]
    return []


def _extra_writes(task: Task, t: int, api_class: str, rng: random.Random) -> list[tuple[ToolCall, str]]:
    """Copies of turn ``t``'s gold calls on ``api_class`` that change compared state, each with one
    argument given another plausible value (:func:`_other_values`, one picked per argument) and
    equivalent to no gold call of the turn."""
    out = []
    for call in task.gold[t]:
        if _owner(task).get(call.name) != api_class or not _writes_state(task, call):
            continue
        schema = _visible(task, t).get(call.name)
        props = _props(schema)
        for k, v in call.arguments.items():
            news = [
                ToolCall(call.name, {**call.arguments, k: o})
                for o in _other_values(task, k, v, props.get(k) or {}, api_class)
            ]
            news = [
                n for n in news if _valid(task, t, n) and not any(calls_equivalent(g, n, schema) for g in task.gold[t])
            ]
            if news:
                new = rng.choice(news)
                out.append((new, f"{call.name} {k}={v!r}->{new.arguments[k]!r}"))
    return out


def _changes_state(task: Task, script: Script, t: int, pos: int) -> bool:
    """Whether call ``pos`` of turn ``t`` of ``script`` changes the compared (public) state when the
    script runs up to it in the real environment (the study may execute; the reward never does)."""
    from envace.envs.bfcl import BFCLEnvironment

    env = BFCLEnvironment.from_task(task)
    try:
        for turn, calls in enumerate(script[: t + 1]):
            env.set_turn(turn)
            for call in calls if turn < t else calls[:pos]:
                env.execute(call, validate=False)
        before = env.snapshot()
        env.execute(script[t][pos], validate=False)
        return bool(env.snapshot() != before)
    finally:
        env.close()


def _turn_level_edits(task: Task, kind: str, api_class: str, rng: random.Random) -> list[tuple[Script, str]]:
    """Edits that add calls to a turn: extra writes before, between or after the gold calls that
    change the state where they run (``noop_write``: that change nothing there, refused or
    redundant), a turn's calls written twice, and read-only calls (in gold turns or empty ones)."""
    gold, out = task.gold, []
    for t, turn in enumerate(gold):
        if kind == "repeat_turn" and any(_writes_state(task, c) for c in turn):
            out.append((_with_turn(gold, t, [*turn, *turn]), f"turn {t}: its {len(turn)} calls twice"))
        elif kind in (*BY_CLASS, "noop_write"):
            positions = {"extra_write_before": [0], "extra_write_after": [len(turn)]}
            at = positions.get(kind, list(range(1, len(turn))) if kind != "noop_write" else list(range(len(turn) + 1)))
            for new, note in _extra_writes(task, t, api_class, rng) if at else []:
                pos = rng.choice(at)
                script = _with_turn(gold, t, [*turn[:pos], new, *turn[pos:]])
                if _changes_state(task, script, t, pos) == (kind != "noop_write"):
                    out.append((script, f"turn {t}: {note} at {pos}"))
        elif kind in ("extra_readonly", "call_in_empty_turn") and bool(turn) == (kind == "extra_readonly"):
            for name in _read_only(task, t):
                pos = rng.randint(0, len(turn))
                calls = [*turn[:pos], ToolCall(name), *turn[pos:]]
                out.append((_with_turn(gold, t, calls), f"turn {t}: {name}() inserted at {pos}"))
    return out


def _moves(task: Task, kind: str) -> list[tuple[Script, str]]:
    """Gold calls moved to the end of the previous turn (``move_earlier``) or the start of the next
    (``move_later``), where that turn has gold calls and the tool is visible there."""
    step = -1 if kind == "move_earlier" else 1
    gold, out = task.gold, []
    for t, i in _sites(gold):
        to = t + step
        if not 0 <= to < len(gold) or not gold[to] or not _valid(task, to, gold[t][i]):
            continue
        script = _with_turn(gold, t, [c for n, c in enumerate(gold[t]) if n != i])
        script[to] = [*gold[to], gold[t][i]] if step < 0 else [gold[t][i], *gold[to]]
        out.append((script, f"turn {t} call {i} {gold[t][i].name}: moved to turn {to}"))
    return out


def _edits(task: Task, kind: str, rng: random.Random, api_class: str = "") -> list[tuple[Script, str]]:
    """Every candidate edit of ``kind`` of the task's gold, with a note naming it."""
    if kind in CLASS_KINDS:
        return class_edits(task, kind, api_class)
    if kind in ("move_earlier", "move_later"):
        return _moves(task, kind)
    if kind in (*BY_CLASS, "noop_write", "repeat_turn", "extra_readonly", "call_in_empty_turn"):
        return _turn_level_edits(task, kind, api_class, rng)
    gold = task.gold
    return [
        (_with_turn(gold, t, calls), f"turn {t} call {i} {gold[t][i].name}: {note}")
        for t, i in _sites(gold)
        for calls, note in _turn_edits(task, kind, t, i, rng)
    ]


def perturb(task: Task, kind: str, rng: random.Random, api_class: str = "") -> Perturbation | None:
    """The task's gold with one change of ``kind`` (one of :data:`KINDS` or :data:`PROBES`),
    picked with ``rng``; ``None`` when the kind does not apply to this task's gold. The
    :data:`PER_CLASS` kinds copy a call of ``api_class``.

    >>> t = Task(id="x", benchmark="bfcl", gold=[[ToolCall("cd", {"folder": "a"}), ToolCall("pwd")]],
    ...          tools=[{"name": "cd", "parameters": {"properties": {"folder": {"type": "string"}}}},
    ...                 {"name": "pwd", "parameters": {"properties": {}}}])
    >>> [c.name for c in perturb(t, "swap_calls", random.Random(0)).script[0]]
    ['pwd', 'cd']
    """
    if kind == "gold":
        return Perturbation(kind, copy.deepcopy(task.gold), "unperturbed")
    if kind not in KINDS + PROBES:
        raise ValueError(f"unknown perturbation {kind!r}; known: {', '.join(KINDS + PROBES)}")
    edits = _edits(task, kind, rng, api_class)
    if not edits:
        return None
    script, note = rng.choice(edits)
    if kind in CLASS_KINDS:
        return Perturbation(kind, copy.deepcopy(script), note, api_class)
    if kind not in PER_CLASS:
        return Perturbation(kind, copy.deepcopy(script), note)
    return Perturbation(kind, copy.deepcopy(script), note, api_class, _inserted(task.gold, script))


def _inserted(gold: Script, script: Script) -> tuple[int, int]:
    """``(turn, index)`` of the one call ``script`` adds to the gold."""
    t = next(t for t, calls in enumerate(script) if len(calls) != len(gold[t]))
    return t, next((i for i, (a, b) in enumerate(zip(script[t], gold[t], strict=False)) if a != b), len(gold[t]))
