"""A tau2-bench reward that needs no environment: gold actions, communicated information, stray writes.

tau2's official reward (``verify_tau2``, ``envace.data.sources.tau2.official_reward``) replays the
episode in the real environment and compares database hashes; during training rewards need no
environment (docs/design.md §3.5), so this one reads the episode's **calls and assistant messages
only, never a tool response** (in training the response is the policy's own rehearsal, so reading
it would let the policy excuse its own calls):

- **actions**: each gold action (``task.extra["actions"]``, assistant and user side, as tau2's
  ``ActionEvaluator``, which reads both) must match some call of the episode: same name, and equal
  values on ``compare_args`` — or, when ``compare_args`` is ``None``, on every argument that the
  action *or* the call names (tau2's ``Action.compare_with_tool_call`` compares only the call's own
  arguments there, so a call that omits arguments, ``{}`` at the extreme, matches; tau2 lets its DB
  check catch that, and without a DB this reward cannot). A gold **write** action is matched
  one-to-one (:func:`match_writes`): one call cannot serve two gold writes;
- **communicate**: each ``communicate_info`` string must occur, case-insensitively, in an assistant
  message with commas removed (tau2's ``CommunicateEvaluator``);
- **stray writes** (a gate): a call to a write tool (``task.extra["write_tools"]``) that no gold
  write action absorbs in a maximum one-to-one matching zeroes the score, **whatever its response
  said**: an error, an empty or malformed rehearsal (which parse to error objects) excuse nothing.
  This is stricter than tau2: a stray write that the real environment refused leaves the DB as the
  gold leaves it, and tau2 pays it (docs/rewards.md).

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
from envace.types import Message, Task, ToolCall, Trajectory


def action_matches(action: dict[str, Any], call: ToolCall) -> bool:
    """Same name, and equal values on ``compare_args``; when that is ``None``, on every argument the
    action or the call names (stricter than tau2's ``Action.compare_with_tool_call``, which compares
    the call's own arguments only). ``compare_args == []`` compares none, as tau2.

    >>> a = {"name": "f", "arguments": {"x": 1, "y": 2}, "compare_args": None}
    >>> action_matches(a, ToolCall("f", {"x": 1, "y": 2})), action_matches(a, ToolCall("f", {"x": 1, "y": 3}))
    (True, False)
    >>> action_matches(a, ToolCall("f", {"x": 1})), action_matches(a, ToolCall("f", {}))  # omitted arguments
    (False, False)
    >>> action_matches({**a, "compare_args": ["x"]}, ToolCall("f", {"x": 1, "y": 3}))
    True
    """
    if action["name"] != call.name:
        return False
    keys = action.get("compare_args")
    keys = set(action["arguments"]) | set(call.arguments) if keys is None else set(keys)
    missing = object()
    return all(action["arguments"].get(k, missing) == call.arguments.get(k, missing) for k in keys)


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


def match_writes(actions: list[dict[str, Any]], calls: list[ToolCall]) -> dict[int, int]:
    """A maximum one-to-one matching of gold write ``actions`` to ``calls``: ``{call index: action index}``.

    Augmenting paths (Kuhn's algorithm), so a call that could serve two actions is moved when that
    frees a place for another call; a greedy first-fit could leave a call stray that has a place.

    >>> loose = {"name": "f", "arguments": {}, "compare_args": []}
    >>> exact = {"name": "f", "arguments": {"x": 1}, "compare_args": None}
    >>> match_writes([loose, exact], [ToolCall("f", {"x": 1}), ToolCall("f", {"x": 2})])
    {0: 1, 1: 0}
    """
    owner: dict[int, int] = {}  # action index -> call index

    def place(c: int, seen: set[int]) -> bool:
        for a, action in enumerate(actions):
            if a in seen or not action_matches(action, calls[c]):
                continue
            seen.add(a)
            if a not in owner or place(owner[a], seen):
                owner[a] = c
                return True
        return False

    for c in range(len(calls)):
        place(c, set())
    return {c: a for a, c in sorted(owner.items(), key=lambda kv: kv[1])}


def write_checks(
    actions: list[dict[str, Any]], calls: list[ToolCall], write_tools: set[str]
) -> tuple[set[int], list[str]]:
    """The indices of the gold write ``actions`` that some write call serves one-to-one
    (:func:`match_writes`), and the names of the write calls that no action absorbs (stray), in
    order. No response is read: a write that "failed" is stray like any other.

    >>> acts = [{"name": "cancel", "arguments": {"id": "A"}, "compare_args": None}]
    >>> write_checks(acts, [ToolCall("cancel", {"id": "A"}), ToolCall("cancel", {"id": "A"})], {"cancel"})
    ({0}, ['cancel'])
    """
    index = [i for i, a in enumerate(actions) if a["name"] in write_tools]
    writes = [c for c in calls if c.name in write_tools]
    matched = match_writes([actions[i] for i in index], writes)
    return {index[a] for a in matched.values()}, [c.name for k, c in enumerate(writes) if k not in matched]


def tau2_reward(task: Task, traj: Trajectory, requestors: tuple[str, ...] = ("assistant", "user")) -> RewardOutput:
    """Score a tau2 episode without an environment (see the module docstring).

    Args:
        task: a tau2 task (``load_tau2``), or any task with gold calls.
        traj: the episode; ``traj.calls`` are its calls (their responses are not read),
            ``traj.messages`` its text.
        requestors: which sides' gold actions are checked.

    >>> t = Task("t", "tau2", extra={"actions": [{"name": "cancel", "arguments": {"id": "A"},
    ...     "compare_args": None, "requestor": "assistant"}], "communicate_info": ["done"], "write_tools": ["cancel"]})
    >>> from envace.types import CallRecord
    >>> good = Trajectory(t, [Message("assistant", "It is done.")], [CallRecord(ToolCall("cancel", {"id": "A"}), {})])
    >>> tau2_reward(t, good).score, tau2_reward(t, Trajectory(t, [])).score
    (1.0, 0.0)
    >>> failed = CallRecord(ToolCall("cancel", {"id": "B"}), {"error": {"code": "EXECUTION_ERROR", "message": "no"}})
    >>> out = tau2_reward(t, Trajectory(t, good.messages, [*good.calls, failed]))
    >>> out.score, out.details["stray_writes"]
    (0.0, ['cancel'])
    """
    actions = [a for a in gold_actions(task) if a.get("requestor", "assistant") in requestors]
    write_tools = set(task.extra.get("write_tools") or [])
    calls = [r.call for r in traj.calls]
    absorbed, stray = write_checks(actions, calls, write_tools)
    action_checks = [
        i in absorbed if a["name"] in write_tools else any(action_matches(a, c) for c in calls)
        for i, a in enumerate(actions)
    ]
    infos = list(task.extra.get("communicate_info") or [])
    info_checks = [communicated(i, traj.messages) for i in infos]
    checks = action_checks + info_checks
    fraction = sum(checks) / len(checks) if checks else 1.0
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
