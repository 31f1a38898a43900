"""Memory notes in the warm start: grounded episodes in which the policy reads a private-rehearsal note
(``EnvACEDataModule(memory_notes=...)``, off by default; docs/data.md "Memory notes").

At test time, imagination appends to every user turn a memory note: a system turn after the user
turn and before the assistant header, rendered by :func:`envace.protocol.memory.render_memory`
(:meth:`envace.inference.Imagination.add_note`). No grounded episode holds one, so a small policy meets
the note first at test time. A noted episode carries, after each user message, a
``Message("system", render_memory(attempts))`` that :func:`envace.protocol.tokens.encode_trajectory`
lays out where test time puts the note (context: never in the loss).

The note's :data:`ATTEMPTS` attempts (test time's N = 2), in random order, are built so that reading
the note helps and copying it blindly does not:

- a turn with gold calls: the gold turn itself (the gold calls with their grounded real responses,
  outcome the turn's closing text) and a corrupted attempt (the gold calls up to a random one, which
  is replaced by a call that fails, answered by its error); in a :data:`BOTH_WRONG` share of the notes
  both attempts are corrupted, so the note can be wrong and the gold is still what the policy must do;
- a turn whose gold is empty (the right answer is to call nothing and say what is missing): both
  attempts are one call that fails.

A failing call is one of :data:`KINDS`, answered by :func:`envace.protocol.parse.validate_call`'s
error: the structured ``{"error": {"code", "message"}}`` a real environment returns for it
(:meth:`envace.envs.bfcl.BFCLEnvironment.execute` validates first).
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

from envace.protocol.memory import Attempt, render_memory
from envace.protocol.parse import tool_name, validate_call
from envace.types import CallRecord, Message, ToolCall, ToolSchema, Trajectory

ATTEMPTS = 2  #: attempts per note: test time's N = 2
BOTH_WRONG = 0.25  #: share of notes (of turns with gold calls) whose attempts are both corrupted
KINDS = ("other_tool", "dropped_argument", "changed_value")  #: how a failing call is made


def retyped(value: Any) -> Any:
    """``value`` as another JSON type (what a schema's ``type`` refuses), or ``None`` for ``null``.

    >>> retyped(5), retyped("a"), retyped(True), retyped([1, "b"]), retyped({"k": 1})
    ('5', ['a'], 'true', '1, b', '{"k": 1}')
    """
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return json.dumps(value) if value is not None else None


def candidates(kind: str, call: ToolCall | None, tools: list[ToolSchema]) -> list[ToolCall]:
    """The calls of one of :data:`KINDS` made from ``call`` (``None``: a turn whose gold is empty, where
    only ``other_tool`` applies, with no arguments).

    >>> tools = [{"name": "cd"}, {"name": "ls"}]
    >>> [c.to_dict() for k in KINDS for c in candidates(k, ToolCall("cd", {"folder": "a"}), tools)]
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'name': 'ls', 'arguments': {'folder': 'a'}}, {'name': 'cd', 'arguments': {}},
     {'name': 'cd', 'arguments': {'folder': ['a']}}]
    """
    args = dict(call.arguments) if call is not None else {}
    if kind == "other_tool":
        return [ToolCall(tool_name(t), args) for t in tools if call is None or tool_name(t) != call.name]
    if call is None:
        return []
    if kind == "dropped_argument":
        return [ToolCall(call.name, {k: v for k, v in args.items() if k != key}) for key in args]
    return [ToolCall(call.name, {**args, key: retyped(value)}) for key, value in args.items()]


def failed_call(call: ToolCall | None, tools: list[ToolSchema], rng: random.Random) -> CallRecord:
    """A call that fails instead of ``call`` (``None``: a turn whose gold is empty), with its error.

    The kinds are tried in a random order, each kind's candidates too; the first candidate the
    tools refuse is taken. When none is refused (no tools, or schemas without types), a call to a
    tool the list does not have.

    >>> tools = [{"name": "cd", "parameters": {"type": "object", "properties": {"folder": {"type": "string"}},
    ...           "required": ["folder"]}}]
    >>> rec = failed_call(ToolCall("cd", {"folder": "a"}), tools, random.Random(0))
    >>> rec.response["error"]["code"], rec.call.name
    ('INVALID_ARGUMENTS', 'cd')
    """
    for kind in rng.sample(KINDS, len(KINDS)):
        made = candidates(kind, call, tools)
        for bad in rng.sample(made, len(made)):
            error = validate_call(bad, tools)
            if error is not None:
                return CallRecord(bad, error)
    bad = ToolCall(f"{call.name if call is not None else 'tool'}_unlisted", call.arguments if call else {})
    return CallRecord(bad, validate_call(bad, tools))


def imagined_attempts(
    gold: list[CallRecord],
    outcome: str,
    tools: list[ToolSchema],
    rng: random.Random,
    both_wrong: float = BOTH_WRONG,
) -> list[Attempt]:
    """The :data:`ATTEMPTS` attempts of one turn's note, in random order (see the module docstring).

    Args:
        gold: the turn's gold calls with their real (grounded or recorded) responses.
        outcome: the turn's closing text (the gold attempt's expected outcome).
        tools: the tools visible at the turn (a failing call's error is the one they give).
        rng: the draw (the same state gives the same attempts).
        both_wrong: the chance that both attempts of a turn with gold calls are corrupted.
    """
    if not gold:
        return [Attempt([failed_call(None, tools, rng)]) for _ in range(ATTEMPTS)]
    wrong = ATTEMPTS if rng.random() < both_wrong else ATTEMPTS - 1
    attempts = [Attempt(list(gold), outcome) for _ in range(ATTEMPTS - wrong)]
    for _ in range(wrong):
        i = rng.randrange(len(gold))
        attempts.append(Attempt([*gold[:i], failed_call(gold[i].call, tools, rng)], outcome))
    rng.shuffle(attempts)
    return attempts


def turns(traj: Trajectory) -> list[tuple[list[CallRecord], str]]:
    """Each user turn of ``traj``: its calls with their responses, and its closing text."""
    records = iter(traj.calls)
    golds: list[list[CallRecord]] = []
    closing: list[str] = []
    for m in traj.messages:
        if m.role == "user":
            golds.append([])
            closing.append("")
        elif m.role == "assistant" and golds and not m.tool_calls:
            closing[-1] = m.content
        elif m.role == "assistant" and golds:
            for call in m.tool_calls:
                rec = next(records, None)
                if rec is None or rec.call != call:
                    raise ValueError(f"task {traj.task.id}: the trajectory's calls do not match its messages")
                golds[-1].append(rec)
    return list(zip(golds, closing, strict=True))


def turn_attempts(traj: Trajectory, rng: random.Random) -> list[list[Attempt]]:
    """The attempts of the note of each user turn of ``traj`` (:func:`imagined_attempts`)."""
    return [imagined_attempts(g, o, traj.task.tools_at(t), rng) for t, (g, o) in enumerate(turns(traj))]


def with_notes(traj: Trajectory, attempts: list[list[Attempt]]) -> Trajectory:
    """``traj`` with, after its ``k``-th user message, the note of ``attempts[k]`` as a system message
    (rendered as test time renders it: :func:`render_memory` with its default ``max_chars``, which is
    :class:`~envace.inference.ImaginationConfig`'s)."""
    notes = iter(attempts)
    messages: list[Message] = []
    for m in traj.messages:
        messages.append(m)
        if m.role == "user":
            messages.append(Message("system", render_memory(next(notes))))
    return replace(traj, messages=messages)


def noted(trajs: list[Trajectory], fraction: float, seed: int) -> list[Trajectory | None]:
    """Per trajectory, its noted copy (:func:`with_notes`) or ``None``: ``round(fraction * n)`` of
    them, drawn with the attempts by one stream seeded by ``seed`` (``fraction`` 0: no draw at all)."""
    if fraction == 0.0:
        return [None] * len(trajs)
    rng = random.Random(f"memory_notes/{seed}")
    chosen = set(rng.sample(range(len(trajs)), round(fraction * len(trajs))))
    return [with_notes(t, turn_attempts(t, rng)) if i in chosen else None for i, t in enumerate(trajs)]
