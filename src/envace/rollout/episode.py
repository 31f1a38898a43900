"""The rollout's shared records: the episode and what a rollout returns (the episodes and their
counts); the (rehearsed, real) fidelity pair it collects is a plain record of :mod:`envace.types`.

An :class:`Episode` is one interaction of the policy with a task: the token episode being built
(:class:`~envace.protocol.tokens.EpisodeBuilder`: ids, roles, sampled log-probs) beside its parsed
record (messages, calls, flags), and the state the rollout and its parts keep on it, each a typed
field. The rollout loop (:mod:`envace.rollout.loop`) writes it; rewards, losses, metrics and
callbacks read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from envace.envs import Environment, canonical_calls, canonical_messages, canonical_task
from envace.protocol.memory import ImaginedTurn
from envace.protocol.tokens import EpisodeBuilder, EpisodeTensors
from envace.types import (
    JSON,
    ROLE_IDS,
    TRUNCATED,
    CallRecord,
    FidelityPair,
    Message,
    Task,
    ToolCall,
    Trajectory,
    error_observation,
)


@dataclass
class Episode:
    """One interaction of the policy with a task: the token episode plus its parsed record.

    Attributes:
        task: the task played.
        builder: the token episode (ids, roles, log-probs of sampled tokens).
        group: index of the task in its rollout (the GRPO group).
        messages, calls: the parsed record (what rewards score).
        writers: who wrote each response of ``calls`` (``policy``, ``simulator``, ``environment``, ...).
        flags: limits that ended the episode (``truncated``, ``max_steps``, ``max_episode_tokens``).
        format_errors: malformed or invalid calls the policy wrote.
        turn: index of the current user turn (-1 before the first).
        steps_in_turn: act steps taken in the current user turn.
        done: whether the episode has ended.
        env: the real environment calls are executed in (responders that need one).
        shadow: a second real environment that sees every call (lockstep fidelity).
        fidelity: (rehearsed, real) response pairs, with ``shadow``.
        rng: the episode's own sampling stream: its tokens do not depend on its batch-mates.
        user_stop: why a simulated user ended the conversation (``None``: it did not).
        replayed: indices of ``task.recorded`` the ``Replay`` responder has used.
        imagined: test-time imagination, one record per imagined user turn (:mod:`envace.inference`).
        note_tokens: context tokens of memory notes in the episode, counted apart from
            ``max_episode_tokens`` (:attr:`budget_used`): a note must not shrink the budget of the
            attempt it informs.
    """

    task: Task
    builder: EpisodeBuilder
    group: int
    messages: list[Message] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    writers: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    format_errors: int = 0
    turn: int = -1
    steps_in_turn: int = 0
    done: bool = False
    env: Environment | None = None
    shadow: Environment | None = None
    fidelity: list[FidelityPair] = field(default_factory=list)
    rng: torch.Generator | None = None
    user_stop: str | None = None
    replayed: set[int] = field(default_factory=set)
    imagined: list[ImaginedTurn] = field(default_factory=list)
    note_tokens: int = 0

    @property
    def ids(self) -> list[int]:
        return self.builder.ids

    @property
    def budget_used(self) -> int:
        """Tokens that count against ``max_episode_tokens``: all but the memory notes'."""
        return len(self.builder.ids) - self.note_tokens

    def open_tool_turn(self) -> list[int]:
        """Append the tool-turn header (context) and return the prompt for the rehearsal."""
        self.builder.context(self.builder.fmt.tool().header)
        return self.builder.ids

    def execute_real(self, call: ToolCall) -> JSON:
        if self.env is None:
            return error_observation("NO_ENVIRONMENT", f"task {self.task.id} has no real environment")
        return self.env.execute(call)

    def finish(self, flag: str | None = None) -> None:
        if flag:
            self.flags.add(flag)
        self.done = True
        for env in (self.env, self.shadow):
            if env is not None:
                env.close()

    def trajectory(self) -> Trajectory:
        """The episode as rewards read it: under drift, the canonical task, messages and calls
        (renamed tools under their own names, refused old-name calls left out; docs/drift.md)."""
        task = self.task
        messages, calls = canonical_messages(task, list(self.messages)), canonical_calls(task, list(self.calls))
        return Trajectory(task=canonical_task(task), messages=messages, calls=calls, source="rollout")

    def tensors(self) -> EpisodeTensors:
        return self.builder.tensors()

    def role_tokens(self) -> dict[str, int]:
        return {role: sum(r == rid for r in self.builder.roles) for role, rid in ROLE_IDS.items()}


@dataclass
class RolloutStats:
    """Counts of one rollout, for ``train/rollout/*`` and ``cost/*`` logging."""

    episodes: int = 0
    act_tokens: int = 0
    rehearse_tokens: int = 0
    context_tokens: int = 0
    turns: int = 0
    calls: int = 0
    env_calls: int = 0
    format_errors: int = 0
    truncated: int = 0
    seconds: float = 0.0
    generated_tokens_per_s: float = 0.0


@dataclass
class RolloutResult:
    """What a timed rollout returns: its episodes (task-major) and their counts."""

    episodes: list[Episode]
    stats: RolloutStats


def summarize(episodes: list[Episode], seconds: float = 0.0, tokens_per_s: float = 0.0) -> RolloutStats:
    """The counts of ``episodes``, rolled out in ``seconds`` at ``tokens_per_s`` generated tokens."""
    st = RolloutStats(episodes=len(episodes), seconds=seconds, generated_tokens_per_s=tokens_per_s)
    for ep in episodes:
        roles = ep.role_tokens()
        st.act_tokens += roles["act"]
        st.rehearse_tokens += roles["rehearse"]
        st.context_tokens += roles["context"]
        st.turns += ep.turn + 1
        st.calls += len(ep.calls)
        st.env_calls += ep.writers.count("environment")
        st.format_errors += ep.format_errors
        st.truncated += TRUNCATED in ep.flags
    return st
