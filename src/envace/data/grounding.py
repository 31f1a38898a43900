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

A call that failed for a reason of the server's, not of the call's (:data:`SERVER_FAILURES`: a
timeout, a crash, a server that never started, garbage on the wire, a response over its bound) is
not the tool's answer: :func:`ground` raises :class:`GroundingFailed` instead of returning it as a
training target, and the warm start drops the task and counts it (``ground_failed/<code>``); past
a declared share of failures the fit stops in one line naming the server (:class:`GroundFailures`).

A chat log without an environment gives the same layout from its recorded responses
(:func:`recorded_trajectory`). A task scored on its first response alone (BFCL single-turn) is its
user turn and one act step holding all its gold calls, with no response (:func:`answer_trajectory`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Literal

from envace.envs.base import ENVIRONMENT_BROKEN, RESPONSE_TOO_LARGE, TIMEOUT, Environment, make_environment
from envace.envs.mcp_bridge import SERVER_CRASHED, SERVER_GARBAGE, SERVER_UNAVAILABLE
from envace.types import JSON, CallRecord, Message, Task, Trajectory, UsageError

log = logging.getLogger(__name__)
DONE_TEXT = "Done: I have completed this request."
NO_CALL_TEXT = (
    "I cannot complete this request with the functions and information I have. "
    "Please provide the missing details or functions."
)
#: error codes of a call that failed for the server's reason: its observation is never a training target
SERVER_FAILURES = frozenset(
    {TIMEOUT, ENVIRONMENT_BROKEN, SERVER_UNAVAILABLE, SERVER_CRASHED, SERVER_GARBAGE, RESPONSE_TOO_LARGE}
)


class GroundingFailed(Exception):
    """A gold call of ``task_id`` got a server failure ``code`` (one of :data:`SERVER_FAILURES`)."""

    def __init__(self, task_id: str, server: str, call: str, code: str, message: str):
        super().__init__(f"task {task_id}: {call}: {code}: {message}")
        self.task_id, self.server, self.call, self.code = task_id, server, call, code


class GroundingStopped(UsageError):
    """Grounding failed for more than the declared share of tasks: the fit stops (one line)."""


def no_episodes_advice(datamodule: object) -> str:
    """What to change when a training batch holds no grounded episode, true for ``datamodule``'s config.

    >>> from types import SimpleNamespace as NS
    >>> no_episodes_advice(NS(warm_start=False, counts={}))
    'set data.warm_start: true'
    >>> dm = NS(warm_start=True, max_sft_tokens=512, counts={"grounded": 3, "sft_dropped_long": 3})
    >>> print(no_episodes_advice(dm))  # doctest: +NORMALIZE_WHITESPACE
    no grounded episode was kept (grounded 3, recorded 0, failed 0, no environment 0, longer than
    data.max_sft_tokens=512: 3)
    """
    if not getattr(datamodule, "warm_start", False):
        return "set data.warm_start: true"
    c = getattr(datamodule, "counts", {})
    return (
        f"no grounded episode was kept (grounded {c.get('grounded', 0)}, recorded {c.get('recorded', 0)}, "
        f"failed {c.get('ground_failed', 0)}, no environment {c.get('ground_skipped_no_env', 0)}, longer than "
        f"data.max_sft_tokens={getattr(datamodule, 'max_sft_tokens', None)}: {c.get('sft_dropped_long', 0)})"
    )


def server_failure(response: JSON) -> tuple[str, str] | None:
    """``(code, message)`` when ``response`` is an error of the server's making, else ``None``.

    >>> server_failure({"error": {"code": "SERVER_CRASHED", "message": "exited"}})
    ('SERVER_CRASHED', 'exited')
    >>> server_failure({"error": {"code": "TOOL_ERROR", "message": "unknown loan"}}) is None  # the tool's answer
    True
    """
    error = response.get("error") if isinstance(response, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    if code not in SERVER_FAILURES:
        return None
    return str(code), str(error.get("message", ""))[:300]  # type: ignore[union-attr]


def server_label(task: Task) -> str:
    """The environment ``task`` grounds in, as a one-line name (an MCP server's command or URL)."""
    env = task.env or {}
    if env.get("kind") == "mcp":
        from envace.envs.mcp_spec import ServerSpec

        try:
            return f"MCP server {ServerSpec.parse(env.get('server') or {}).label}"
        except ValueError:
            return "MCP server (invalid spec)"
    return f"{env.get('kind')} environment {env.get('module') or env.get('class') or ''}".rstrip()


class GroundFailures:
    """The warm start's grounding failures: counted by code, and the fit stopped past a declared share."""

    def __init__(self) -> None:
        self.failures: list[GroundingFailed] = []

    def add(self, failure: GroundingFailed, counts: Counter[str]) -> None:
        """Count ``failure`` in ``counts`` (``ground_failed`` and ``ground_failed/<code>``) and log it."""
        self.failures.append(failure)
        counts.update(["ground_failed", f"ground_failed/{failure.code}"])
        log.warning("grounding failed, task dropped: %s", failure)

    def check(self, grounded: int, max_share: float) -> None:
        """Raise :class:`GroundingStopped` when more than ``max_share`` of the attempts failed."""
        attempted = grounded + len(self.failures)
        if not self.failures or len(self.failures) <= max_share * attempted:
            return
        first = self.failures[0]
        raise GroundingStopped(
            f"grounding failed for {len(self.failures)} of {attempted} tasks (more than "
            f"data.max_ground_failed={max_share:g} of them): {first.server}: first failure: {first}"
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
                failed = server_failure(response)
                if failed is not None:
                    raise GroundingFailed(task.id, server_label(task), call.name, *failed)
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
