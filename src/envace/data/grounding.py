"""Grounded trajectories: a task's gold calls replayed in its real environment (docs/design.md §4).

The conversation starts at the first user turn (no system message: the prompt builder adds the
system prompt and the tool block). Each user turn becomes

1. the user message;
2. the gold calls, in order, each as an assistant message holding that one call followed by its
   tool message (``steps="call"``, the default). BFCL's gold for a turn executes in sequence and
   its later calls often use what an earlier one returned (a user id from ``message_get_user_id``,
   a file name from ``find``: 78 of the 734 ``multi_turn_base`` turns), so an act turn should see
   each response before the next call. ``steps="turn"`` instead puts all of a turn's calls in one
   assistant message followed by one tool message per call;
3. a tool message's ``content`` is ``json.dumps`` of the real response, ``name`` the tool name;
4. a closing assistant text message: :data:`DONE_TEXT` after calls, :data:`NO_CALL_TEXT` when the
   gold for the turn is empty (BFCL ``miss_param``/``miss_func`` turns where the right behaviour is
   to not call anything and say what is missing).

Works for any task whose environment :func:`envace.envs.make_environment` can build and whose
``gold`` lists one call list per user turn. Environments with turn-dependent tools expose
``set_turn(turn)``; it is called before each turn.

A chat log without an environment gives the same layout from its recorded responses
(:func:`recorded_trajectory`). A task scored on its first response alone (BFCL single-turn) is its
user turn and one act step holding all its gold calls, with no response (:func:`answer_trajectory`).
"""

from __future__ import annotations

import json
from typing import Literal

from envace.envs.base import Environment, make_environment
from envace.types import CallRecord, Message, Task, Trajectory

DONE_TEXT = "Done: I have completed this request."
NO_CALL_TEXT = (
    "I cannot complete this request with the functions and information I have. "
    "Please provide the missing details or functions."
)


def ground(
    task: Task,
    env: Environment | None = None,
    steps: Literal["call", "turn"] = "call",
    done_text: str = DONE_TEXT,
    no_call_text: str = NO_CALL_TEXT,
) -> Trajectory:
    """Replay ``task.gold`` in a real environment and return the grounded conversation.

    Args:
        task: a task with ``user_turns`` and one gold call list per turn.
        env: the environment to run in; default: a fresh one from ``make_environment(task)``,
            closed afterwards (a given one is left open, in its final state).
        steps: ``"call"``: one assistant message per gold call, each followed by its response;
            ``"turn"``: one assistant message with all of a turn's calls, then their responses.
        done_text: the assistant's closing text after a turn with calls.
        no_call_text: the assistant's text for a turn whose gold is empty.
    """
    if steps not in ("call", "turn"):
        raise ValueError(f"steps must be 'call' or 'turn', got {steps!r}")
    if len(task.gold) != len(task.user_turns):
        raise ValueError(f"task {task.id}: {len(task.gold)} gold turns for {len(task.user_turns)} user turns")
    own = env is None
    env = env if env is not None else make_environment(task)
    if env is None:
        raise ValueError(f"task {task.id}: no real environment to ground in (task.env is empty)")
    messages: list[Message] = []
    calls: list[CallRecord] = []
    try:
        for turn, (text, gold) in enumerate(zip(task.user_turns, task.gold, strict=True)):
            env.set_turn(turn)
            messages.append(Message("user", text))
            if gold and steps == "turn":
                messages.append(Message("assistant", "", tool_calls=list(gold)))
            for call in gold:
                if steps == "call":
                    messages.append(Message("assistant", "", tool_calls=[call]))
                response = env.execute(call, validate=False)  # benchmark gold runs as upstream runs it
                calls.append(CallRecord(call, response))
                messages.append(Message("tool", json.dumps(response, ensure_ascii=False), name=call.name))
            messages.append(Message("assistant", done_text if gold else no_call_text))
    finally:
        if own:
            env.close()
    return Trajectory(task=task, messages=messages, calls=calls, source="grounded")


def recorded_trajectory(task: Task) -> Trajectory | None:
    """A chat log's own conversation (user turns, calls, recorded responses) as a trajectory, like
    :func:`ground` lays it out; ``None`` when a call has no recorded response or
    a turn without calls would need the log's text for that turn (only the final text is kept)."""
    if not task.recorded or len(task.gold) != len(task.user_turns):
        return None
    records = iter(task.recorded)
    messages: list[Message] = []
    calls: list[CallRecord] = []
    for turn, (text, gold) in enumerate(zip(task.user_turns, task.gold, strict=True)):
        messages.append(Message("user", text))
        for call in gold:
            rec = next(records, None)
            if rec is None or rec.call != call:
                return None
            messages.append(Message("assistant", "", tool_calls=[call]))
            messages.append(Message("tool", json.dumps(rec.response, ensure_ascii=False), name=call.name))
            calls.append(rec)
        closing = task.extra.get("final_response") if turn == len(task.user_turns) - 1 else None
        if not closing and not gold:
            return None
        messages.append(Message("assistant", closing or DONE_TEXT))
    return Trajectory(task=task, messages=messages, calls=calls, source="recorded")


def answer_trajectory(task: Task) -> Trajectory | None:
    """A task scored on its first act step alone (``extra["first_step_answer"]``: BFCL single-turn):
    the user turn, then one assistant message holding every gold call, and nothing after it (no
    response, no closing text: the episode ends there). ``None`` without one user turn and gold calls.

    >>> from envace.types import ToolCall
    >>> t = Task("t", "bfcl", user_turns=["add"], gold=[[ToolCall("f", {"a": 1}), ToolCall("g")]])
    >>> [(m.role, [c.name for c in m.tool_calls]) for m in answer_trajectory(t).messages]
    [('user', []), ('assistant', ['f', 'g'])]
    """
    if len(task.user_turns) != 1 or len(task.gold) != 1 or not task.gold[0]:
        return None
    messages = [Message("user", task.user_turns[0]), Message("assistant", "", tool_calls=list(task.gold[0]))]
    return Trajectory(task=task, messages=messages, calls=[], source="answer")
