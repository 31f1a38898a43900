"""The BFCL multi-turn reward without an environment (docs/design.md §3.5): which user turns pass.

:func:`bfcl_multi_turn` is an env-free proxy of the multi-turn score, which is state-based: per
user turn, the gold calls must appear among the turn's calls with equal names and equivalent
arguments (:func:`~envace.rewards.bfcl.calls_equivalent`), in the gold's order wherever the order
can matter, and no other call may change state that the official checker compares (a write with
other arguments, a second order or tweet), by the static per-tool table
:mod:`envace.rewards.bfcl_effects`. A read made in an earlier turn may stand for a gold call, as the
checker's results check allows (:func:`turn_failures` and its helpers). The official multi-turn
checker executes both and needs the environment; the validation loop runs it, the training reward
does not. Its agreement with the official checker is measured by ``studies/reward_agreement/reward_agreement.py``
(``docs/rewards.md``). Turns are delimited by user messages (:func:`~envace.rewards.bfcl.calls_per_turn`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from envace.rewards.base import RewardOutput
from envace.rewards.bfcl import calls_equivalent, calls_per_turn, tool_classes
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
from envace.types import Task, ToolCall, ToolSchema, Trajectory


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


def _into_gold_turns(gold: list[list[ToolCall]], turns: list[list[ToolCall]]) -> list[list[ToolCall]]:
    """The calls of each turn whose gold is empty moved to the start of the next turn whose gold is not
    (dropped when there is none): the official checker never checks a turn whose gold is empty, and
    its calls run, in the same order, before the next one's, so that turn's state and result checks
    see them as its first calls (the turn itself must still make a call: :func:`turn_failures`).

    >>> a, b = ToolCall("a"), ToolCall("b")
    >>> [[c.name for c in t] for t in _into_gold_turns([[a], [], [b], []], [[a], [b], [a], [b]])]
    [['a'], [], ['b', 'a'], []]
    """
    out: list[list[ToolCall]] = []
    waiting: list[ToolCall] = []
    for t, calls in enumerate(turns):
        if gold[t]:
            out.append([*waiting, *calls])
            waiting = []
        else:
            out.append([])
            waiting += calls
    return out


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
    made = [bool(calls) for calls in turns[: len(gold)]]  # the checker wants a call in the turn itself
    turns = _into_gold_turns(gold, turns[: len(gold)])
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
        if not calls or not made[t]:  # the checker fails a turn with gold calls and no call of its own
            why.append("" if not calls else "no call")
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

    * every gold call is matched to its own equivalent call
      (:func:`~envace.rewards.bfcl.calls_equivalent`), in the gold's order where two calls do not
      commute (:func:`~envace.rewards.bfcl_effects.conflict`); a call made in an earlier turn may
      stand for one when it changes no compared state and commutes with everything since
      (:func:`_carries`);
    * no other call may change what the official checker compares (:func:`_harm`): a write with
      other arguments, a second order or tweet, a ``cd`` before more file operations fail the turn;
      reads and exact repeats of idempotent calls do not;
    * a turn whose gold is empty is not judged: its calls count as the first calls of the next turn
      whose gold is not (:func:`_into_gold_turns`), as the checker runs and checks them.

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
