"""The world-rehearsal rollout: act → parse calls → respond → act … per user turn.

One loop serves the method and every baseline: the responder decides who answers a call.

:meth:`Rollout.play` is one episode's whole course, top to bottom: each user turn, each act step,
each call and its answer, until the episode ends. It is a generator: where the episode needs a
generation (its act, the rehearsal of a call, a simulator's response) it yields an :class:`Ask` and
is resumed with the sample. :func:`drive` runs the courses of all episodes of a rollout (G episodes
of each of several tasks) together: it batches the generations they wait for per engine, and with
the engine's continuous batching an episode whose generation ends is resumed at once and its next
generation joins the rows still decoding (``SamplingConfig.continuous``). Scripted engines
(``instant``) write their turns at once, in the episode's own course.

An episode may also wait for other episodes: test-time imagination (:mod:`envace.inference`) is a
``before_turn`` hook that yields a :class:`Join` of imagined copies, which run to their end (batched
with everything else) before the committed episode acts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial

import torch

from envace.envs import accepted_tools, make_environment
from envace.protocol import parse_act
from envace.protocol.render import ChatFormat
from envace.protocol.tokens import EpisodeBuilder, PieceEncoder
from envace.rollout.engine import Engine, Request, Sample
from envace.rollout.episode import Episode, FidelityPair, RolloutResult, summarize
from envace.rollout.responders import Responder, ToolTurn
from envace.types import JSON, MAX_EPISODE_TOKENS, MAX_STEPS, TRUNCATED, CallRecord, Message, Task, ToolCall

#: tokens that must still fit in the episode for a call to be answered
RESPONSE_ROOM = 64


@dataclass
class RolloutLimits:
    """Limits that end an episode with a flag, and the token budgets of its generations.

    Args:
        max_steps_per_turn: act steps the policy may take within one user turn.
        max_calls_per_step: calls honoured in one act step; further ones get a TOO_MANY_CALLS error.
        max_new_tokens: tokens per act generation (a turn that does not end by then is truncated).
        max_rehearse_tokens: tokens per generated tool response, whoever writes it (the policy
            rehearsing, an external simulator); one that does not end by then is truncated.
        max_episode_tokens: tokens in the whole episode: a generation starts only when its full budget
            still fits (context already appended may end a little past it).
    """

    max_steps_per_turn: int = 4
    max_calls_per_step: int = 4
    max_new_tokens: int = 256
    max_rehearse_tokens: int = 128
    max_episode_tokens: int = 4096


@dataclass
class Ask:
    """A generation an episode waits for: ``request`` (prompt, budget, random stream) of ``engine``."""

    engine: Engine
    request: Request


@dataclass
class Join:
    """Courses (of imagined episodes) that run to their end before the course that yields this goes on."""

    courses: list[Course]


Course = Generator[Ask | Join, Sample | None, None]
UserHook = Callable[[Episode], str | None]
TurnHook = Callable[[Episode], Course]


def scripted_user(episode: Episode) -> str | None:
    """The task's next scripted user turn, or ``None`` when the script is over."""
    nxt = episode.turn + 1
    return episode.task.user_turns[nxt] if nxt < len(episode.task.user_turns) else None


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
        before_turn: a course each episode runs at the start of every user turn, before its first act
            (test-time imagination, :func:`envace.inference.imagining_rollout`).
        after_step: a course each episode runs before it acts again within a user turn (the calls of
            its last act step answered): imagination revised by what the environment answered.
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
        before_turn: TurnHook | None = None,
        after_step: TurnHook | None = None,
    ):
        self.engine, self.fmt, self.encode = engine, fmt, encode
        self.responder, self.limits, self.user, self.lockstep = responder, limits or RolloutLimits(), user, lockstep
        self.validate_calls, self.before_turn, self.after_step = validate_calls, before_turn, after_step
        responder.bind(engine, encode.tokenizer)

    def run(self, tasks: list[Task], group_size: int = 1, seeds: list[int] | None = None) -> list[Episode]:
        """``group_size`` episodes of each task, generated together; returns them task-major.

        Each episode samples from its own random stream, seeded from ``seeds`` (one per episode,
        task-major) or else from the global generator: an episode's tokens then depend on its seed,
        not on which episodes it was batched with (the same seeds rolled out one at a time sample
        the same tokens, up to float rounding between batch shapes).
        """
        return run_together([Job(self, tasks, group_size, seeds)])[0]

    def timed(self, tasks: list[Task], group_size: int = 1, seeds: list[int] | None = None) -> RolloutResult:
        """:meth:`run`, with the rollout's counts and the policy engine's throughput."""
        began, stats = time.perf_counter(), self.engine.stats
        tokens, seconds = stats.tokens, stats.seconds
        episodes = self.run(tasks, group_size, seeds)
        rate = (stats.tokens - tokens) / (stats.seconds - seconds) if stats.seconds > seconds else 0.0
        return RolloutResult(episodes, summarize(episodes, time.perf_counter() - began, rate))

    def start_all(self, tasks: list[Task], group_size: int = 1, seeds: list[int] | None = None) -> list[Episode]:
        """The episodes of :meth:`run`, started (task-major), each with its random stream."""
        pairs = [(g, task) for g, task in enumerate(tasks) for _ in range(group_size)]
        if seeds is not None and len(seeds) != len(pairs):
            raise ValueError(f"{len(pairs)} episodes but {len(seeds)} seeds")
        drawn = seeds if seeds is not None else torch.randint(0, 2**62, (len(pairs),)).tolist()
        return [self.start(task, g, seed) for (g, task), seed in zip(pairs, drawn, strict=True)]

    def start(self, task: Task, group: int, seed: int = 0) -> Episode:
        """A fresh episode of ``task``: its system turn, its environments, its random stream, and its
        first user turn (none: the episode is already over)."""
        rng = torch.Generator().manual_seed(seed)
        ep = Episode(task=task, builder=EpisodeBuilder(self.encode, self.fmt), group=group, rng=rng)
        ep.builder.system(task.system_prompt, task.tools)
        if self.responder.needs_env:
            ep.env = make_environment(task)
        if self.lockstep:  # a second real environment that sees the same calls in the same order
            ep.shadow = make_environment(task)
        self._next_user_turn(ep)
        return ep

    # --- one episode, top to bottom ----------------------------------------------------------------
    def play(self, ep: Episode) -> Course:
        """The episode's course from its first user turn (:meth:`start`) to its end: each turn
        (imagined first, with ``before_turn``), then the next, until the user or a limit ends it."""
        while not ep.done:
            if self.before_turn is not None:
                yield from self.before_turn(ep)
            yield from self.play_turn(ep)
            self._next_user_turn(ep)

    def play_turn(self, ep: Episode) -> Course:
        """The current user turn: act, answer each call, act again … until the policy acts without
        calling (the turn is over) or a limit ends the episode."""
        limits = self.limits
        while not ep.done:
            if ep.steps_in_turn >= limits.max_steps_per_turn:
                ep.finish(MAX_STEPS)
                return None
            if ep.steps_in_turn and self.after_step is not None:  # the last step's calls are answered
                yield from self.after_step(ep)
            if not self._room(ep, limits.max_new_tokens):
                return None
            ep.builder.context(self.fmt.assistant().header)
            sample = yield self.ask(self.engine, ep, ep.ids, limits.max_new_tokens)
            calls = self._record_act(ep, sample)
            if not calls:
                return None  # truncated, or the turn's answer to the user
            for call, error in calls:
                if call is None:  # an invalid call: its error is the tool turn
                    self._context_tool_turn(ep, error)
                    continue
                if not self._room(ep, RESPONSE_ROOM):
                    return None
                turn = yield from self._answer(ep, call)
                self._record_response(ep, call, turn)
                if ep.done:
                    return None
        return None

    def _answer(self, ep: Episode, call: ToolCall) -> Generator[Ask | Join, Sample | None, ToolTurn]:
        """The responder's answer to ``call``: at once, or written by a generation."""
        gen = self.responder.generation(ep, call, self.limits.max_rehearse_tokens)
        if gen is None:
            return self.responder.respond([ep], [call])[0]
        sample = yield self.ask(gen.engine, ep, gen.prompt, gen.max_new_tokens, gen.own_stream)
        assert sample is not None  # an Ask is answered with its sample (only a Join resumes with None)
        return gen.turn(sample)

    @staticmethod
    def ask(engine: Engine, ep: Episode, prompt: list[int], max_new_tokens: int, own_stream: bool = True) -> Ask:
        """A generation for ``ep`` (a copy of the prompt: the episode's ids grow once the sample is in),
        drawn from the episode's own stream unless ``own_stream`` is off."""
        rng = ep.rng if own_stream else None
        return Ask(engine, Request(list(prompt), max_new_tokens, rng, episode=ep))

    def _next_user_turn(self, ep: Episode) -> None:
        """Begin the next user turn; the episode ends when the user has no more."""
        if ep.done:
            return
        text = self.user(ep)
        if text is None:
            return ep.finish()
        ep.turn += 1
        ep.steps_in_turn = 0
        if ep.task.tools_added.get(str(ep.turn)):
            for env in (ep.env, ep.shadow):
                if env is not None:
                    env.set_turn(ep.turn)
        ep.builder.user_turn(ep.task, ep.turn, text)
        ep.messages.append(Message("user", text))

    def _room(self, ep: Episode, budget: int) -> bool:
        if ep.budget_used + budget > self.limits.max_episode_tokens:
            ep.finish(MAX_EPISODE_TOKENS)
            return False
        return True

    def _record_act(self, ep: Episode, sample: Sample | None) -> list[tuple[ToolCall | None, JSON]]:
        """Append the act and parse it: its calls (``None`` with the error for an invalid one);
        none when it was truncated or made no call."""
        assert sample is not None
        ep.builder.sampled(sample.ids, "act", sample.logprobs)
        ep.steps_in_turn += 1
        if not sample.stopped:
            ep.finish(TRUNCATED)
            return []
        ep.builder.context(self.fmt.assistant().trailer)
        text = self.encode.tokenizer.decode(sample.ids, skip_special_tokens=True)
        tools = accepted_tools(ep.task, ep.turn) if self.validate_calls else None  # docs, or what drift accepts
        parsed = parse_act(text, tools, self.limits.max_calls_per_step)
        ep.format_errors += parsed.n_errors
        ep.messages.append(Message("assistant", parsed.content, parsed.valid_calls))
        return list(zip(parsed.calls, parsed.errors, strict=True))

    def _record_response(self, ep: Episode, call: ToolCall, turn: ToolTurn) -> None:
        if ep.shadow is not None:  # first: a truncated turn below ends the episode, which closes its environments
            real = ep.shadow.execute(call)
            ep.fidelity.append(FidelityPair(call, turn.response, real, ep.task.benchmark))
        if turn.ids is not None:  # written inline: the responder opened the header
            if turn.rehearsed:
                assert turn.logprobs is not None
                ep.builder.sampled(turn.ids, "rehearse", turn.logprobs)
            else:  # another model's tokens, as it sampled them: context
                ep.builder.context_ids(turn.ids)
            if turn.stopped:
                ep.builder.context(self.fmt.tool().trailer)
            else:
                ep.finish(TRUNCATED)
        else:
            self._context_tool_turn(ep, turn.response)
        ep.calls.append(CallRecord(call, turn.response))
        ep.writers.append(turn.writer)
        ep.messages.append(Message("tool", json.dumps(turn.response, ensure_ascii=False), name=call.name))

    def _context_tool_turn(self, ep: Episode, response: JSON) -> None:
        """Append a response someone else wrote (an environment, a record, an error), rendered; one
        that does not fit the episode's token budget ends it (``max_episode_tokens``) unappended: a
        real response can be any length (BFCL's long-context classes return thousands of tokens),
        and an episode past its budget would be a memory bill for the update, not a longer lesson."""
        p = self.fmt.tool()
        ids = self.encode(p.header + self.fmt.tool_body(response) + p.end + p.trailer)
        if ep.budget_used + len(ids) > self.limits.max_episode_tokens:
            ep.finish(MAX_EPISODE_TOKENS)
            return
        ep.builder.context_ids(ids)


# --- many episodes at once -------------------------------------------------------------------------
@dataclass
class Job:
    """One rollout's share of :func:`run_together`: ``group_size`` episodes of each of ``tasks``."""

    rollout: Rollout
    tasks: list[Task]
    group_size: int = 1
    seeds: list[int] | None = None


def run_together(jobs: list[Job]) -> list[list[Episode]]:
    """Several rollouts (other responders, other engines) generated as one: their episodes' courses
    are driven together, so generations of an engine they share batch across them (validation's
    committed, imagined and gold episodes). Returns each job's episodes, task-major; the same seeds
    give the same episodes as each rollout run alone."""
    for engine in {id(job.rollout.engine): job.rollout.engine for job in jobs}.values():
        engine.reset_cache()  # the weights may have changed since the last rollout
    started = [job.rollout.start_all(job.tasks, job.group_size, job.seeds) for job in jobs]
    drive([job.rollout.play(ep) for job, episodes in zip(jobs, started, strict=True) for ep in episodes])
    return started


@dataclass(eq=False)
class _Running:
    """A course being driven; ``parent``: the course that joined it, waiting for ``left`` of them."""

    course: Course
    parent: _Running | None = None
    left: int = 0


def drive(courses: list[Course]) -> None:
    """Run ``courses`` to their end. The generations they wait for are batched per engine (the first
    waiting engine's, then the next); an engine streams its batch, and as each generation ends its
    course is resumed at once: its next generation from the same engine joins the running batch, one
    from another engine waits for that engine's turn."""
    waiting = [ask for c in courses for ask in _advance(_Running(c), None)]
    while waiting:
        engine = waiting[0].engine
        batch = [a for a in waiting if a.engine is engine]
        waiting = [a for a in waiting if a.engine is not engine]
        later: list[Ask] = []
        engine.stream([a.request for a in batch], partial(_follow, engine, later))
        waiting += later


def _follow(engine: Engine, later: list[Ask], request: Request, sample: Sample) -> list[Request]:
    """As ``request`` ends: resume its course; its next generations from ``engine`` join the running
    batch, the others wait in ``later``."""
    nxt = _advance(request.tag, sample)
    later += [a for a in nxt if a.engine is not engine]
    return [a.request for a in nxt if a.engine is engine]


def _advance(running: _Running, value: Sample | None) -> list[Ask]:
    """Resume ``running`` with ``value`` up to the generations it (or the courses it joins, or the
    course whose join it completes) waits for next; an instant engine's turns are written on the way."""
    asks: list[Ask] = []
    while True:
        try:
            step = running.course.send(value)
        except StopIteration:
            parent = running.parent
            if parent is None:
                return asks
            parent.left -= 1
            if parent.left:
                return asks
            running, value = parent, None  # the last joined course ended: the parent goes on
            continue
        if isinstance(step, Join):
            if not step.courses:
                value = None
                continue
            running.left = len(step.courses)
            for course in step.courses:
                asks += _advance(_Running(course, running), None)
            return asks
        if step.engine.instant:
            value = sample_now(step.engine, step.request)
            continue
        step.request.tag = running
        asks.append(step)
        return asks


def sample_now(engine: Engine, request: Request) -> Sample:
    """The one sample of ``request``, generated alone."""
    out: list[Sample] = []

    def keep(_: Request, sample: Sample) -> list[Request]:
        out.append(sample)
        return []

    engine.stream([request], keep)
    return out[0]
