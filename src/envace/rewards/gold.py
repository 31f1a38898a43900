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
    made = calls_per_turn(traj.messages)
    turns, exact = [], []
    for i, gold in enumerate(task.gold):
        calls = made[i] if i < len(made) else []
        gold_keys, made_keys = [call_key(c) for c in gold], [call_key(c) for c in calls]
        turns.append(prf(gold_keys, made_keys)[2])
        exact.append(gold_keys == made_keys)
    score = sum(turns) / len(turns)
    details = {"turn_f1": turns, "turns_exact": sum(exact), "turns": len(turns), "n_called": sum(map(len, made))}
    return RewardOutput(score=score, success=all(exact), details=details)
