"""Gold-call matching (reward ``gold-calls``): the episode's calls, turn by turn, against the task's gold calls.

For each user turn the calls the policy made in it (:func:`~envace.rewards.bfcl.calls_per_turn`) are
compared with the turn's gold calls as whole calls — the name and the arguments, compared as JSON
values (``1`` equals ``1.0``; a missing argument is not a default one). A turn's score is the F1
of the two multisets of whole calls (:func:`~envace.rewards.toolf1.prf`); the episode's score is
the mean over its user turns; ``success`` is every turn's calls equal to its gold, in order, and
nothing more.

No tool response enters the score (docs/rewards.md, "No tool response excuses a call"): a call that
got an error still counts as made, and an id the gold reuses must be the id the real server
assigns — a rehearsal that invents another id makes the calls that use it wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from envace.rewards.base import RewardOutput
from envace.rewards.bfcl import calls_per_turn
from envace.rewards.toolf1 import prf
from envace.types import Task, ToolCall, Trajectory


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def call_key(call: ToolCall) -> str:
    """A call as one comparable string: its name and its canonical arguments.

    >>> call_key(ToolCall("f", {"n": 2.0, "a": [1]})) == call_key(ToolCall("f", {"a": [1], "n": 2}))
    True
    """
    return json.dumps([call.name, _canonical(call.arguments)], sort_keys=True, default=str)


def _per_turn(
    task: Task, traj: Trajectory, kept: Callable[[ToolCall], bool]
) -> tuple[list[float], list[bool], list[list[ToolCall]]]:
    """Per user turn, the F1 of the whole ``kept`` calls made against the gold's (1.0 when neither has
    one) and whether they are equal in order; and the calls made, per turn."""
    made = calls_per_turn(traj.messages)
    turns, exact = [], []
    for i, gold in enumerate(task.gold):
        calls = made[i] if i < len(made) else []
        gold_keys, made_keys = [call_key(c) for c in gold if kept(c)], [call_key(c) for c in calls if kept(c)]
        turns.append(prf(gold_keys, made_keys)[2])
        exact.append(gold_keys == made_keys)
    return turns, exact, made


def gold_calls(task: Task, traj: Trajectory) -> RewardOutput:
    """Score = mean per-turn F1 of whole calls against the gold; success = every turn exact (module docstring).

    >>> from envace.types import Message
    >>> buy, status = ToolCall("buy", {"sku": "M"}), ToolCall("status", {"id": "A1"})
    >>> t = Task("t", "tasks", user_turns=["a"], gold=[[buy, status]])
    >>> made = lambda *cs: Trajectory(t, [Message("user", "a"), Message("assistant", tool_calls=list(cs))])
    >>> out = gold_calls(t, made(buy, status))
    >>> out.score, out.success
    (1.0, True)
    >>> out = gold_calls(t, made(buy, ToolCall("status", {"id": "A7"})))
    >>> out.score, out.success
    (0.5, False)
    """
    if not task.gold:
        raise ValueError(f"task {task.id} has no gold calls: the gold-calls reward needs them (or name another reward)")
    turns, exact, made = _per_turn(task, traj, lambda call: True)
    score = sum(turns) / len(turns)
    details = {"turn_f1": turns, "turns_exact": sum(exact), "turns": len(turns), "n_called": sum(map(len, made))}
    return RewardOutput(score=score, success=all(exact), details=details)


def gold_writes(task: Task, traj: Trajectory) -> RewardOutput:
    """Reward ``gold-writes`` (ShopWorld, docs/shopworld.md): only the calls the task scores count — its
    writes and its required reads (``task.extra["scored_tools"]``, by name) — and other reads are free.
    ``success``: those calls equal the gold's, in order, and nothing more (an extra or refused write
    fails); ``score``: the F1 of the two multisets (GRPO's dense signal). Reads the calls only: no tool
    response enters (the state-replay oracle, :func:`envace.envs.shopworld.final_state`, checks it agrees).

    >>> from envace.types import Message
    >>> find, buy = ToolCall("search", {"q": "mug"}), ToolCall("buy", {"sku": "K7Q2"})
    >>> t = Task("t", "shopworld", user_turns=["a"], gold=[[find, buy]], extra={"scored_tools": ["buy"]})
    >>> made = lambda *cs: Trajectory(t, [Message("user", "a"), Message("assistant", tool_calls=list(cs))])
    >>> [(o.score, o.success) for o in (gold_writes(t, made(buy)), gold_writes(t, made(find, find, buy)))]
    [(1.0, True), (1.0, True)]
    >>> out = gold_writes(t, made(buy, ToolCall("buy", {"sku": "K7Q3"})))
    >>> round(out.score, 3), out.success
    (0.667, False)
    """
    scored = task.extra.get("scored_tools")
    if not task.gold or not isinstance(scored, list):
        raise ValueError(f"task {task.id}: the gold-writes reward needs gold calls and extra.scored_tools")
    names = set(scored)
    turns, exact, made = _per_turn(task, traj, lambda call: call.name in names)
    details = {"turn_f1": turns, "n_called": sum(map(len, made))}
    return RewardOutput(score=sum(turns) / len(turns), success=all(exact), details=details)
