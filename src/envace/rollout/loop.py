"""The world-rehearsal rollout: act → parse calls → respond → act … per user turn.

One loop serves the method and every baseline: the responder decides who answers a call. Each
episode moves on by itself through everything that needs no generation (parsing, real environments,
limits) and then waits for a generation (its act, or the rehearsal of a call); the waiting
generations of all episodes (G samples of each of several tasks) are batched per engine. With the
engine's continuous batching an episode whose generation ends moves on at once, and its next
generation joins the rows still decoding (``SamplingConfig.continuous``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from envace.envs import Environment, make_environment
from envace.protocol import parse_act
from envace.protocol.episode import EpisodeBuilder, EpisodeTensors, PieceEncoder
from envace.protocol.render import ChatFormat
from envace.rollout.engine import Engine, Request, Sample
from envace.rollout.responders import Generation, Responder, ToolTurn
from envace.types import JSON, ROLE_IDS, CallRecord, Message, Task, ToolCall, Trajectory, error_observation


@dataclass
class RolloutLimits:
    """Limits that end an episode with a flag.

    Args:
        max_steps_per_turn: act steps the policy may take within one user turn.
        max_calls_per_step: calls honoured in one act step; further ones get a TOO_MANY_CALLS error.
        max_new_tokens: tokens per act generation (a turn that does not end by then is truncated).
        max_episode_tokens: tokens in the whole episode: a generation starts only when its full budget
            still fits (context already appended may end a little past it).
    """

    max_steps_per_turn: int = 4
    max_calls_per_step: int = 4
    max_new_tokens: int = 256
    max_episode_tokens: int = 4096


@dataclass
class FidelityPair:
    """A rehearsed response and the real one, for the same call in the same state."""

    call: ToolCall
    rehearsed: JSON
    real: JSON
    benchmark: str


@dataclass
class Episode:
    """One interaction of the policy with a task: the token episode plus its parsed record."""

    task: Task
    builder: EpisodeBuilder
    group: int
    messages: list[Message] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)
    format_errors: int = 0
    turn: int = -1
    steps_in_turn: int = 0
    done: bool = False
    pending: list[tuple[ToolCall | None, dict[str, Any] | None]] = field(default_factory=list)
    env: Environment | None = None
    shadow: Environment | None = None
    fidelity: list[FidelityPair] = field(default_factory=list)
    scratch: dict[str, Any] = field(default_factory=dict)
    user_stop: str | None = None  # why a simulated user ended the conversation (None: it did not)
    replayed: set[int] = field(default_factory=set)  # indices of task.recorded the Replay responder used
    rng: torch.Generator | None = None  # the episode's own sampling stream (see GenerationEngine.generate)

    @property
    def ids(self) -> list[int]:
        return self.builder.ids

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
        return Trajectory(task=self.task, messages=list(self.messages), calls=list(self.calls), source="rollout")

    def tensors(self) -> EpisodeTensors:
        return self.builder.tensors()

    def role_tokens(self) -> dict[str, int]:
        return {role: sum(r == rid for r in self.builder.roles) for role, rid in ROLE_IDS.items()}


UserHook = Callable[[Episode], str | None]


def scripted_user(episode: Episode) -> str | None:
    """The task's next scripted user turn, or ``None`` when the script is over."""
    nxt = episode.turn + 1
    return episode.task.user_turns[nxt] if nxt < len(episode.task.user_turns) else None


@dataclass
class RolloutStats:
    episodes: int = 0
    act_tokens: int = 0
    rehearse_tokens: int = 0
    context_tokens: int = 0
    turns: int = 0
    calls: int = 0
    format_errors: int = 0
    truncated: int = 0
    seconds: float = 0.0
    generated_tokens_per_s: float = 0.0


@dataclass
class Wait:
    """A generation an episode waits for: ``max_new_tokens`` after ``prompt`` from ``engine``; ``done``
    records the sample in the episode."""

    episode: Episode
    engine: Engine
    prompt: list[int]
    max_new_tokens: int
    done: Callable[[Sample], None]
    own_stream: bool = True

    def request(self) -> Request:
        """The engine's request (a copy of the prompt: the episode's ids grow once the sample is in)."""
        return Request(list(self.prompt), self.max_new_tokens, self.episode.rng if self.own_stream else None, self)


class Rollout:
    """Runs groups of episodes to completion.

    Args:
        engine: the policy's generation engine.
        fmt: the chat format.
        encode: the piece encoder over the policy's tokenizer.
        responder: who answers tool calls.
        limits: episode limits.
        user: the user-turn hook (scripted by default; a user simulator for tau2).
        lockstep: also execute every call in a real environment and keep (rehearsed, real) pairs.
        validate_calls: check each parsed call against the visible tools' schemas (model-written
            calls always are); ``False`` only for reference policies that write the benchmark's own
            gold, which the official harnesses run without a schema check.
    """

    def __init__(
        self,
        engine: Engine,
        fmt: ChatFormat,
        encode: PieceEncoder,
        responder: Responder,
        limits: RolloutLimits | None = None,
        user: UserHook = scripted_user,
        lockstep: bool = False,
        validate_calls: bool = True,
    ):
        self.engine, self.fmt, self.encode = engine, fmt, encode
        self.responder, self.limits, self.user, self.lockstep = responder, limits or RolloutLimits(), user, lockstep
        self.validate_calls = validate_calls
        responder.bind(engine, encode.tokenizer)

    def run(self, tasks: list[Task], group_size: int = 1, seeds: list[int] | None = None) -> list[Episode]:
        """``group_size`` episodes of each task, generated together; returns them task-major.

        Each episode samples from its own random stream, seeded from ``seeds`` (one per episode,
        task-major) or else from the global generator: an episode's tokens then depend on its seed,
        not on which episodes it was batched with (the same seeds rolled out one at a time sample
        the same tokens, up to float rounding between batch shapes).
        """
        self.engine.reset_cache()  # the weights may have changed since the last rollout
        episodes = self._episodes(tasks, group_size, seeds)
        self._drive(episodes)
        return episodes

    def _drive(self, episodes: list[Episode]) -> None:
        """Run ``episodes`` to their end: the generations they wait for are batched per engine (and,
        for engines that cannot stream, per token budget); an engine that streams (continuous
        batching) runs each episode's next generation as soon as its previous one ends. Scripted
        engines (``instant``) write their turns at once, in the episode's own course."""
        waiting = [w for ep in episodes if (w := self._resume(ep)) is not None]
        while waiting:
            engine, budget = waiting[0].engine, waiting[0].max_new_tokens
            stream = getattr(engine, "stream", None)
            batch = [w for w in waiting if w.engine is engine and (stream is not None or w.max_new_tokens == budget)]
            taken = {id(w) for w in batch}
            waiting = [w for w in waiting if id(w) not in taken]
            if stream is not None:
                later: list[Wait] = []

                def follow(
                    request: Request, sample: Sample, engine: Engine = engine, later: list[Wait] = later
                ) -> list[Request]:
                    nxt = self._resume(request.tag.episode, request.tag, sample)
                    if nxt is not None and nxt.engine is engine:
                        return [nxt.request()]
                    later.extend([nxt] if nxt is not None else [])
                    return []

                stream([w.request() for w in batch], follow)
                waiting += later
            else:
                samples = engine.generate([w.prompt for w in batch], budget, [w.episode for w in batch])
                for w, sample in zip(batch, samples, strict=True):
                    if (nxt := self._resume(w.episode, w, sample)) is not None:
                        waiting.append(nxt)

    def _resume(self, ep: Episode, wait: Wait | None = None, sample: Sample | None = None) -> Wait | None:
        """Record ``sample`` (of ``wait``) in ``ep`` and move it on to the next generation it waits for
        from an engine that is not instant (a scripted engine's turn is written here and now)."""
        while True:
            if wait is not None and sample is not None:
                wait.done(sample)
            wait = self._next(ep)
            if wait is None or not getattr(wait.engine, "instant", False):
                return wait
            sample = wait.engine.generate([wait.prompt], wait.max_new_tokens, [ep])[0]

    def _next(self, ep: Episode) -> Wait | None:
        """Move ``ep`` on through whatever needs no generation (invalid calls, responders that answer
        at once, limits, user turns); the generation it waits for next, or ``None`` once it is done."""
        while not ep.done:
            if not ep.pending:
                if ep.steps_in_turn >= self.limits.max_steps_per_turn:
                    ep.finish("max_steps")
                elif self._room(ep, self.limits.max_new_tokens):
                    ep.builder.context(self.fmt.assistant().header)
                    return Wait(ep, self.engine, ep.ids, self.limits.max_new_tokens, partial(self._record_act, ep))
                continue
            call, error = ep.pending[0]
            if call is None:  # an invalid call: its error is the tool turn
                ep.pending.pop(0)
                self._context_tool_turn(ep, error)
                continue
            if not self._room(ep, 64):
                continue
            gen = self.responder.generation(ep, call)
            if gen is None:
                ep.pending.pop(0)
                self._record_response(ep, call, self.responder.respond([ep], [call])[0])
                continue
            return Wait(ep, gen.engine, gen.prompt, gen.max_new_tokens, partial(self._answered, ep, call, gen),
                        gen.own_stream)  # fmt: skip
        return None

    def _answered(self, ep: Episode, call: ToolCall, gen: Generation, sample: Sample) -> None:
        ep.pending.pop(0)
        self._record_response(ep, call, gen.turn(sample))

    def _episodes(self, tasks: list[Task], group_size: int, seeds: list[int] | None) -> list[Episode]:
        """The episodes of a rollout, started, each with its random stream."""
        pairs = [(g, task) for g, task in enumerate(tasks) for _ in range(group_size)]
        if seeds is not None and len(seeds) != len(pairs):
            raise ValueError(f"{len(pairs)} episodes but {len(seeds)} seeds")
        drawn = seeds if seeds is not None else torch.randint(0, 2**62, (len(pairs),)).tolist()
        return [self._start(task, g, seed) for (g, task), seed in zip(pairs, drawn, strict=True)]

    def _start(self, task: Task, group: int, seed: int = 0) -> Episode:
        rng = torch.Generator().manual_seed(seed)
        ep = Episode(task=task, builder=EpisodeBuilder(self.encode, self.fmt), group=group, rng=rng)
        ep.builder.system(task.system_prompt, task.tools)
        if self.responder.needs_env:
            ep.env = make_environment(task)
        if self.lockstep:  # a second real environment that sees the same calls in the same order
            ep.shadow = make_environment(task)
        self._next_user_turn(ep)
        return ep

    def _next_user_turn(self, ep: Episode) -> None:
        text = self.user(ep)
        if text is None:
            return ep.finish()
        ep.turn += 1
        ep.steps_in_turn = 0
        added = ep.task.tools_added.get(str(ep.turn))
        if added:
            ep.builder.context(self.fmt.system("New tools are available.", added))
            for env in (ep.env, ep.shadow):
                if env is not None:
                    env.set_turn(ep.turn)
        ep.builder.user(text)
        ep.messages.append(Message("user", text))

    def _room(self, ep: Episode, budget: int) -> bool:
        if len(ep.ids) + budget > self.limits.max_episode_tokens:
            ep.finish("max_episode_tokens")
            return False
        return True

    def _record_act(self, ep: Episode, sample: Sample) -> None:
        ep.builder.sampled(sample.ids, "act", sample.logprobs)
        ep.steps_in_turn += 1
        if not sample.stopped:
            return ep.finish("truncated")
        ep.builder.context(self.fmt.assistant().trailer)
        text = self.encode.tokenizer.decode(sample.ids, skip_special_tokens=True)
        tools = ep.task.tools_at(ep.turn) if self.validate_calls else None
        parsed = parse_act(text, tools, self.limits.max_calls_per_step)
        ep.format_errors += parsed.n_errors
        ep.messages.append(Message("assistant", parsed.content, parsed.valid_calls))
        if parsed.calls:
            ep.pending = list(zip(parsed.calls, parsed.errors, strict=True))
        else:
            self._next_user_turn(ep)

    def _record_response(self, ep: Episode, call: ToolCall, turn: ToolTurn) -> None:
        if turn.rehearsed:
            assert turn.ids is not None and turn.logprobs is not None
            ep.builder.sampled(turn.ids, "rehearse", turn.logprobs)  # the responder opened the header
            if turn.stopped:
                ep.builder.context(self.fmt.tool().trailer)
            else:
                ep.finish("truncated")
        else:
            self._context_tool_turn(ep, turn.response)
        if ep.shadow is not None:
            real = ep.shadow.execute(call)
            ep.fidelity.append(FidelityPair(call, turn.response, real, ep.task.benchmark))
        ep.calls.append(CallRecord(call, turn.response))
        ep.messages.append(Message("tool", _dumps(turn.response), name=call.name))

    def _context_tool_turn(self, ep: Episode, response: JSON) -> None:
        p = self.fmt.tool()
        ep.builder.context(p.header + self.fmt.tool_body(response) + p.end + p.trailer)


def _dumps(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False)


def summarize(episodes: list[Episode], seconds: float = 0.0, engine: Engine | None = None) -> RolloutStats:
    """Counts for ``rollout/*`` logging."""
    st = RolloutStats(episodes=len(episodes), seconds=seconds)
    for ep in episodes:
        roles = ep.role_tokens()
        st.act_tokens += roles["act"]
        st.rehearse_tokens += roles["rehearse"]
        st.context_tokens += roles["context"]
        st.turns += ep.turn + 1
        st.calls += len(ep.calls)
        st.format_errors += ep.format_errors
        st.truncated += "truncated" in ep.flags
    if engine is not None:
        st.generated_tokens_per_s = engine.stats.tokens_per_s
    return st


def timed_run(rollout: Rollout, tasks: list[Task], group_size: int) -> tuple[list[Episode], RolloutStats]:
    began = time.perf_counter()
    episodes = rollout.run(tasks, group_size)
    return episodes, summarize(episodes, time.perf_counter() - began, rollout.engine)
