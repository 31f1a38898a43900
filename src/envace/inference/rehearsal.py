"""Test-time private rehearsal (DESIGN.md §1): imagine N attempts of a user turn, condense them into
a rehearsal memory, then commit one execution against the real environment.

For every user turn of every committed episode, before the policy acts:

1. **imagine** — N copies of the committed episode (same token ids so far) play the turn with the
   policy acting *and* answering its own calls inline (:class:`~envace.rollout.PolicyRehearsal`;
   nothing is executed). ``parallel``: the N attempts are independent and all episodes' attempts
   generate together in one batch per step. ``sequential``: attempt k starts from the committed
   context plus the memory of attempts 1..k-1 and so can revise them; attempt k of every episode
   still generates together;
2. **condense** — each attempt becomes an :class:`~envace.inference.memory.Attempt` (calls,
   rehearsed results, expected outcome, errors) and the attempts a text note;
3. **commit** — the note is appended to the committed episode as a context segment (a system turn
   placed after the user turn and before the assistant header, so it is part of the prompt of every
   later step and turn but never of the loss), and the turn runs against the committed responder
   (the real environment) as usual.

Rehearsal tokens (everything the policy generated in imagined attempts) are counted apart from
committed tokens (what it generated in the committed episode) and from the memory note's tokens.
``n = 0`` (or mode ``none``) is plain execution, token for token.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from envace.inference.memory import Attempt, render_memory
from envace.protocol.episode import EpisodeBuilder, PieceEncoder
from envace.protocol.render import ChatFormat
from envace.rollout.engine import Engine, EngineStats, Sample
from envace.rollout.loop import Episode, Rollout, RolloutLimits, UserHook, Wait, scripted_user
from envace.rollout.responders import PolicyRehearsal, Responder
from envace.types import ROLE_IDS

Mode = Literal["none", "parallel", "sequential"]
_UNREHEARSED = "rehearsal_pending"
RECORDS = "rehearsal"  # Episode.scratch key: one record per rehearsed user turn


@dataclass
class RehearsalConfig:
    """How many imagined attempts precede each committed user turn, and how they are run.

    Args:
        mode: ``none`` (plain execution), ``parallel`` (independent attempts) or ``sequential``
            (attempt k sees the memory of attempts 1..k-1).
        n: attempts per user turn (0 = plain execution).
        n_values: a sweep over several ``n`` in one evaluation run (overrides ``n``; 0 = plain).
        modes: the modes of the sweep (overrides ``mode`` for every ``n > 0``).
        rehearse_tokens: most tokens of one rehearsed tool response.
        max_steps: act steps an imagined attempt may take (default: the committed limit).
        max_chars: most characters of each argument list, result and outcome in the note.
    """

    mode: Mode = "none"
    n: int = 0
    n_values: list[int] | None = None
    modes: list[Mode] | None = None
    rehearse_tokens: int = 128
    max_steps: int | None = None
    max_chars: int = 200

    @property
    def active(self) -> bool:
        return self.mode != "none" and self.n > 0

    def settings(self) -> list[RehearsalConfig]:
        """The (mode, n) settings this config asks for: one, or the sweep's, plain execution first.

        >>> [(s.mode, s.n) for s in RehearsalConfig(n_values=[0, 2], modes=["parallel", "sequential"]).settings()]
        [('none', 0), ('parallel', 2), ('sequential', 2)]
        >>> [(s.mode, s.n) for s in RehearsalConfig(mode="parallel", n=0).settings()]
        [('none', 0)]
        """
        ns = self.n_values if self.n_values is not None else [self.n]
        modes: list[Mode] = list(self.modes) if self.modes is not None else [self.mode]
        out = []
        for n in sorted(set(ns)):
            chosen: list[Mode] = ["none"] if n <= 0 else [m for m in modes if m != "none"]
            for mode in chosen:
                out.append(RehearsalConfig(mode, max(n, 0), None, None, self.rehearse_tokens, self.max_steps,
                                           self.max_chars))  # fmt: skip
        if not out:
            raise ValueError(f"no rehearsal setting in n={ns}, modes={modes}")
        return out


@dataclass
class TurnRecord:
    """What rehearsal spent and wrote before one committed user turn."""

    turn: int
    attempts: list[Attempt] = field(default_factory=list)
    memory_tokens: int = 0

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.attempts)


def fork(episode: Episode) -> Episode:
    """An imagined copy of ``episode``: the same ids, roles and record so far, no environment."""
    b = episode.builder
    builder = EpisodeBuilder(b.encode, b.fmt, ids=list(b.ids), roles=list(b.roles), logprobs=list(b.logprobs))
    scratch = {k: copy.deepcopy(v) for k, v in episode.scratch.items() if k not in (RECORDS, _UNREHEARSED)}
    rng = None  # the copy's own stream, drawn from the episode's: each imagined attempt samples differently
    if episode.rng is not None:
        rng = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=episode.rng)))
    return Episode(
        task=episode.task,
        builder=builder,
        group=episode.group,
        messages=list(episode.messages),
        calls=list(episode.calls),
        format_errors=episode.format_errors,
        turn=episode.turn,
        scratch=scratch,
        replayed=set(episode.replayed),
        user_stop=episode.user_stop,
        rng=rng,
    )


def attempt_of(imagined: Episode, origin: Episode, start: int) -> Attempt:
    """Condense an imagined episode, forked from ``origin`` when it had ``start`` tokens."""
    new_messages = imagined.messages[len(origin.messages) :]
    texts = [m.content for m in new_messages if m.role == "assistant" and not m.tool_calls and m.content]
    policy_ids = (ROLE_IDS["act"], ROLE_IDS["rehearse"])
    return Attempt(
        calls=list(imagined.calls[len(origin.calls) :]),
        outcome=texts[-1] if texts else "",
        format_errors=imagined.format_errors - origin.format_errors,
        flags=sorted(imagined.flags),
        tokens=sum(r in policy_ids for r in imagined.builder.roles[start:]),
    )


def _end_of_turn(episode: Episode) -> str | None:
    """The user hook of imagined episodes: the attempt ends with the turn."""
    return None


class RehearsingRollout(Rollout):
    """A :class:`~envace.rollout.Rollout` whose every user turn is privately rehearsed first.

    Args:
        engine, fmt, encode, responder, limits, user, lockstep, validate_calls: as
            :class:`~envace.rollout.Rollout`; ``responder`` answers the *committed* calls (the real
            environment).
        rehearsal: the rehearsal setting (``n``, ``mode``, ...).
        imagine: who answers imagined calls (default: the policy itself, :class:`PolicyRehearsal`).
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
        rehearsal: RehearsalConfig | None = None,
        imagine: Responder | None = None,
    ):
        super().__init__(engine, fmt, encode, responder, limits, user, lockstep, validate_calls)
        self.rehearsal = rehearsal or RehearsalConfig()
        steps = self.rehearsal.max_steps or self.limits.max_steps_per_turn
        imagined_limits = replace(self.limits, max_steps_per_turn=steps)
        self.imagination = Rollout(
            engine, fmt, encode, imagine or PolicyRehearsal(self.rehearsal.rehearse_tokens), imagined_limits,
            user=_end_of_turn, validate_calls=validate_calls,
        )  # fmt: skip
        self._imagining = _Imagining(self)

    def _next(self, ep: Episode) -> Wait | None:
        """As :meth:`Rollout._next`; an episode that has begun a user turn first waits for its
        rehearsal, which runs for all episodes waiting for theirs together."""
        if not ep.done and not ep.pending and ep.scratch.get(_UNREHEARSED):
            return Wait(ep, self._imagining, [], 0, _nothing)
        return super()._next(ep)

    def _next_user_turn(self, ep: Episode) -> None:
        super()._next_user_turn(ep)
        if not ep.done and self.rehearsal.active:
            ep.scratch[_UNREHEARSED] = True

    def rehearse(self, episodes: list[Episode]) -> None:
        """Rehearse the current user turn of those ``episodes`` that just began one."""
        fresh = [e for e in episodes if not e.done and e.scratch.pop(_UNREHEARSED, False)]
        if not fresh:
            return
        attempts: dict[int, list[Attempt]] = {id(e): [] for e in fresh}
        rounds = 1 if self.rehearsal.mode == "parallel" else self.rehearsal.n
        per_round = self.rehearsal.n if self.rehearsal.mode == "parallel" else 1
        for _ in range(rounds):
            batch: list[tuple[Episode, Episode, int]] = []
            for ep in fresh:
                for _ in range(per_round):
                    im = fork(ep)
                    if attempts[id(ep)]:  # sequential: the memory of the attempts so far
                        im.builder.context(self.fmt.system(self._note(attempts[id(ep)]), []))
                    batch.append((ep, im, len(ep.ids)))
            self.imagination._drive([im for _, im, _ in batch])
            for ep, im, start in batch:
                attempts[id(ep)].append(attempt_of(im, ep, start))
        for ep in fresh:
            span = ep.builder.context(self.fmt.system(self._note(attempts[id(ep)]), []))
            record = TurnRecord(ep.turn, attempts[id(ep)], span.stop - span.start)
            ep.scratch.setdefault(RECORDS, []).append(record)

    def _note(self, attempts: list[Attempt]) -> str:
        return render_memory(attempts, self.rehearsal.max_chars)


class _Imagining:
    """Stands in for an engine in :meth:`Rollout._drive`: "generating" for the episodes waiting for
    their rehearsal rehearses their current user turns, all together."""

    def __init__(self, rollout: RehearsingRollout) -> None:
        self.rollout = rollout
        self.stats = EngineStats()

    def generate(self, prompts: list[list[int]], max_new_tokens: int, episodes: Any = None) -> list[Sample]:
        self.rollout.rehearse(list(episodes))
        return [Sample([], [], stopped=True) for _ in prompts]

    def reset_cache(self) -> None:
        """Nothing is cached."""


def _nothing(sample: Sample) -> None:
    """What a rehearsal's stand-in sample adds to the episode (the note is already there)."""


@dataclass
class TokenCounts:
    """Tokens of one committed episode by origin."""

    rehearsal: int = 0
    committed: int = 0
    memory: int = 0
    attempts: int = 0


def token_counts(episode: Episode) -> TokenCounts:
    """Rehearsal tokens (generated in imagined attempts), committed tokens (generated in the committed
    episode: act, and rehearse when the committed responder is the policy) and memory-note tokens."""
    records: list[TurnRecord] = episode.scratch.get(RECORDS, [])
    roles = episode.role_tokens()
    return TokenCounts(
        rehearsal=sum(r.tokens for r in records),
        committed=roles["act"] + roles["rehearse"],
        memory=sum(r.memory_tokens for r in records),
        attempts=sum(len(r.attempts) for r in records),
    )
