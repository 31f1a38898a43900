"""A tau2-bench reward that needs no environment: gold actions, communicated information, stray writes.

tau2's official reward (``verify_tau2``, ``envace.data.sources.tau2.official_reward``) replays the
episode in the real environment and compares database hashes; during training rewards need no
environment (docs/design.md §3.5), so this one checks what can be read off the episode:

- **actions**: each gold action (``task.extra["actions"]``, assistant and user side, as tau2's
  ``ActionEvaluator``, which reads both) must match some call of the episode with tau2's
  ``Action.compare_with_tool_call`` semantics: same name, and equal values on ``compare_args`` —
  or, when ``compare_args`` is ``None``, on the arguments *the call* passed (so omitting an
  argument is not a mismatch, adding an unknown one is);
- **communicate**: each ``communicate_info`` string must occur, case-insensitively, in an assistant
  message with commas removed (tau2's ``CommunicateEvaluator``);
- **stray writes** (a gate): a call to a write tool (``task.extra["write_tools"]``) that succeeded
  and is not absorbed one-to-one by a matching gold action would change the database and fail
  tau2's DB check, so it zeroes the score.

``score = (passed checks / checks) * (no stray write)``; with no checks at all (a refusal task with
no gold actions and nothing to communicate) the fraction is 1: such an episode is paid when it
wrote nothing, as tau2 pays it. ``success`` = every check passed and no stray write. Unlike tau2's
airline/retail reward (DB + communicate), read-only gold actions count here, so the do-nothing
episode that tau2 pays on 19/50 airline and 7/114 retail tasks scores 0 wherever gold has actions.
Telecom's env assertions need the environment and are not checked; user-side actions count only
when the rollout records the user simulator's calls in ``traj.calls`` (pass ``requestors=("assistant",)``
to judge the agent alone).
"""

from __future__ import annotations

from typing import Any

from envace.rewards.base import RewardOutput
from envace.types import Message, Task, ToolCall, Trajectory, is_error


def action_matches(action: dict[str, Any], call: ToolCall) -> bool:
    """tau2's ``Action.compare_with_tool_call`` on plain data.

    >>> a = {"name": "f", "arguments": {"x": 1, "y": 2}, "compare_args": None}
    >>> action_matches(a, ToolCall("f", {"x": 1})), action_matches(a, ToolCall("f", {"x": 1, "y": 3}))
    (True, False)
    >>> action_matches({**a, "compare_args": ["x"]}, ToolCall("f", {"x": 1, "y": 3}))
    True
    """
    if action["name"] != call.name:
        return False
    keys = action.get("compare_args")
    keys = list(call.arguments) if keys is None else keys
    if not keys:
        return True
    called = {k: v for k, v in call.arguments.items() if k in keys}
    wanted = {k: v for k, v in action["arguments"].items() if k in keys}
    return called == wanted


def communicated(info: str, messages: list[Message]) -> bool:
    """tau2's communicate check: ``info`` in some assistant text, lower-cased, commas removed.

    >>> communicated("1,000", [Message("assistant", "The refund is 1000 dollars.")])
    False
    >>> communicated("1000", [Message("assistant", "The refund is 1,000 dollars.")])
    True
    """
    needle = info.lower()
    return any(
        m.role == "assistant" and m.content.strip() and needle in m.content.lower().replace(",", "") for m in messages
    )


def gold_actions(task: Task) -> list[dict[str, Any]]:
    """The task's tau2 actions, or its gold calls (assistant side, all arguments compared)."""
    if "actions" in task.extra:
        return list(task.extra["actions"])
    return [
        {"name": c.name, "arguments": c.arguments, "compare_args": None, "requestor": "assistant"}
        for turn in task.gold
        for c in turn
    ]


def stray_writes(actions: list[dict[str, Any]], traj: Trajectory, write_tools: set[str]) -> list[str]:
    """Successful write calls that no unused matching gold action absorbs, by name, in order."""
    unused = [a for a in actions if a["name"] in write_tools]
    stray = []
    for record in traj.calls:
        if record.call.name not in write_tools or is_error(record.response):
            continue
        hit = next((a for a in unused if action_matches(a, record.call)), None)
        if hit is None:
            stray.append(record.call.name)
        else:
            unused.remove(hit)
    return stray


def tau2_reward(task: Task, traj: Trajectory, requestors: tuple[str, ...] = ("assistant", "user")) -> RewardOutput:
    """Score a tau2 episode without an environment (see the module docstring).

    Args:
        task: a tau2 task (``load_tau2``), or any task with gold calls.
        traj: the episode; ``traj.calls`` are its calls with their responses, ``traj.messages`` its text.
        requestors: which sides' gold actions are checked.

    >>> t = Task("t", "tau2", extra={"actions": [{"name": "cancel", "arguments": {"id": "A"},
    ...     "compare_args": None, "requestor": "assistant"}], "communicate_info": ["done"], "write_tools": ["cancel"]})
    >>> from envace.types import CallRecord
    >>> good = Trajectory(t, [Message("assistant", "It is done.")], [CallRecord(ToolCall("cancel", {"id": "A"}), {})])
    >>> tau2_reward(t, good).score, tau2_reward(t, Trajectory(t, [])).score
    (1.0, 0.0)
    >>> bad = Trajectory(t, good.messages, [CallRecord(ToolCall("cancel", {"id": "B"}), {})])
    >>> tau2_reward(t, bad).score, tau2_reward(t, bad).details["stray_writes"]
    (0.0, ['cancel'])
    """
    actions = [a for a in gold_actions(task) if a.get("requestor", "assistant") in requestors]
    calls = [r.call for r in traj.calls]
    action_checks = [any(action_matches(a, c) for c in calls) for a in actions]
    infos = list(task.extra.get("communicate_info") or [])
    info_checks = [communicated(i, traj.messages) for i in infos]
    checks = action_checks + info_checks
    fraction = sum(checks) / len(checks) if checks else 1.0
    stray = stray_writes(actions, traj, set(task.extra.get("write_tools") or []))
    score = 0.0 if stray else fraction
    return RewardOutput(
        score=score,
        success=all(checks) and not stray,
        details={
            "actions": [{"name": a["name"], "matched": ok} for a, ok in zip(actions, action_checks, strict=True)],
            "communicate": [{"info": i, "met": ok} for i, ok in zip(infos, info_checks, strict=True)],
            "stray_writes": stray,
            "fraction": fraction,
        },
    )
