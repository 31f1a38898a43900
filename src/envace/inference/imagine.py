"""Test-time imagination (the paper's *private rehearsal*, docs/design.md §1): imagine N attempts of a
user turn, condense them into a memory, then commit one execution against the real environment.

For every user turn of every committed episode, before the policy acts (the rollout's
``before_turn`` hook, :class:`Imagination`):

1. **imagine** — N copies of the committed episode (same token ids so far, :func:`fork`) play the
   turn with the policy acting *and* answering its own calls (role ``rehearse``,
   :class:`~envace.rollout.PolicyRehearsal`; nothing is executed). ``parallel``: the N attempts are
   independent and run together. ``sequential``: attempt k starts from the committed context plus
   the memory of attempts 1..k-1 and so can revise them. Every episode's attempts are batched with
   every other generation of the rollout;
2. **condense** — each attempt becomes an :class:`~envace.protocol.memory.Attempt` (calls,
   rehearsed results, expected outcome, errors) and the attempts a text note;
3. **commit** — the note is appended to the committed episode as a context segment (a system turn
   placed after the user turn and before the assistant header, so it is part of the prompt of every
   later step and turn but never of the loss), and the turn runs against the committed responder
   (the real environment) as usual.

With ``reimagine = k > 0`` (a mitigation of drift, off by default), imagination is conditioned on
what the real environment answered: once an act step's calls are answered, if a real response has a
shape the latest attempts did not rehearse for its tool (:func:`~envace.protocol.memory.unforeseen`:
other keys, an error, another type), the rest of the turn is imagined again from the committed
context, which now holds the real responses, and its note appended (at most k times per user turn).

Imagination tokens (everything the policy generated in imagined attempts) are counted apart from
committed tokens (what it generated in the committed episode) and from the memory note's tokens.
``n = 0`` (or mode ``none``) is plain execution, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from envace.protocol.memory import Attempt, ImaginedTurn, render_memory, unforeseen
from envace.protocol.render import ChatFormat
from envace.protocol.tokens import EpisodeBuilder, PieceEncoder
from envace.rollout.engine import Engine
from envace.rollout.episode import Episode
from envace.rollout.loop import Course, Join, Rollout, RolloutLimits
from envace.rollout.responders import PolicyRehearsal, Responder
from envace.types import ROLE_IDS

Mode = Literal["none", "parallel", "sequential"]


@dataclass
class ImaginationConfig:
    """How many imagined attempts precede each committed user turn, and how they are run.

    Args:
        mode: ``none`` (plain execution), ``parallel`` (independent attempts) or ``sequential``
            (attempt k sees the memory of attempts 1..k-1).
        n: attempts per user turn (0 = plain execution).
        n_values: a sweep over several ``n`` in one evaluation run (overrides ``n``; 0 = plain).
        modes: the modes of the sweep (overrides ``mode`` for every ``n > 0``).
        max_steps: act steps an imagined attempt may take (default: the committed limit).
        max_chars: most characters of each argument list, result and outcome in the note.
        reimagine: times per user turn the rest of the turn is imagined again after a real response
            the attempts did not foresee (0: never; the drift mitigation, docs/drift.md).

    Imagined tool responses take the rollout's ``limits.max_rehearse_tokens``, as committed ones do.
    """

    mode: Mode = "none"
    n: int = 0
    n_values: list[int] | None = None
    modes: list[Mode] | None = None
    max_steps: int | None = None
    max_chars: int = 200
    reimagine: int = 0

    @property
    def active(self) -> bool:
        return self.mode != "none" and self.n > 0

    def settings(self) -> list[ImaginationConfig]:
        """The (mode, n) settings this config asks for: one, or the sweep's, plain execution first.

        >>> [(s.mode, s.n) for s in ImaginationConfig(n_values=[0, 2], modes=["parallel", "sequential"]).settings()]
        [('none', 0), ('parallel', 2), ('sequential', 2)]
        >>> [(s.mode, s.n) for s in ImaginationConfig(mode="parallel", n=0).settings()]
        [('none', 0)]
        """
        ns = self.n_values if self.n_values is not None else [self.n]
        modes: list[Mode] = list(self.modes) if self.modes is not None else [self.mode]
        out = []
        for n in sorted(set(ns)):
            chosen: list[Mode] = ["none"] if n <= 0 else [m for m in modes if m != "none"]
            out += [replace(self, mode=mode, n=max(n, 0), n_values=None, modes=None) for mode in chosen]
        if not out:
            raise ValueError(f"no imagination setting in n={ns}, modes={modes}")
        return out


def fork(episode: Episode) -> Episode:
    """An imagined copy of ``episode``: the same ids, roles and record so far, no environment."""
    b = episode.builder
    builder = EpisodeBuilder(b.encode, b.fmt, ids=list(b.ids), roles=list(b.roles), logprobs=list(b.logprobs))
    rng = None  # the copy's own stream, drawn from the episode's: each imagined attempt samples differently
    if episode.rng is not None:
        rng = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=episode.rng)))
    return Episode(
        task=episode.task,
        builder=builder,
        group=episode.group,
        messages=list(episode.messages),
        calls=list(episode.calls),
        writers=list(episode.writers),
        format_errors=episode.format_errors,
        turn=episode.turn,
        steps_in_turn=episode.steps_in_turn,
        rng=rng,
        user_stop=episode.user_stop,
        replayed=set(episode.replayed),
        note_tokens=episode.note_tokens,
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


class Imagination:
    """The ``before_turn`` hook of a committed rollout: imagine the turn, then write the note.

    Args:
        imagined: the rollout whose :meth:`~envace.rollout.Rollout.play_turn` plays the imagined
            attempts (its responder answers imagined calls: the policy itself by default).
        config: the setting (``n``, ``mode``, ...).
        fmt: the chat format (the note is a system turn).
    """

    def __init__(self, imagined: Rollout, config: ImaginationConfig, fmt: ChatFormat) -> None:
        self.imagined, self.config, self.fmt = imagined, config, fmt

    def __call__(self, ep: Episode) -> Course:
        """Imagine ``ep``'s current user turn (the ``before_turn`` hook)."""
        if ep.done or not self.config.active:
            return
        yield from self.imagine(ep, revised=False)

    def revise(self, ep: Episode) -> Course:
        """The ``after_step`` hook (``reimagine > 0``): imagine the rest of the turn again when a real
        response since the latest imagination has a shape its attempts did not foresee, at most
        ``reimagine`` times per user turn."""
        latest = ep.imagined[-1] if ep.imagined else None
        if ep.done or latest is None or latest.turn != ep.turn:
            return
        revisions = sum(r.revised for r in ep.imagined if r.turn == ep.turn)
        if revisions < self.config.reimagine and unforeseen(latest.attempts, ep.calls[latest.at_call :]):
            yield from self.imagine(ep, revised=True)

    def imagine(self, ep: Episode, revised: bool) -> Course:
        """Imagine from ``ep``'s committed context: parallel attempts join together, sequential ones
        one after another (each reading the note of those before); then the note, and the record."""
        parallel = self.config.mode == "parallel"
        attempts: list[Attempt] = []
        for _ in range(1 if parallel else self.config.n):
            copies = [fork(ep) for _ in range(self.config.n if parallel else 1)]
            if attempts:  # sequential: the memory of the attempts so far
                self.add_note(copies[0], attempts, revised)
            yield Join([self._attempt(im) for im in copies])
            attempts += [attempt_of(im, ep, len(ep.ids)) for im in copies]
        written = self.add_note(ep, attempts, revised)
        ep.imagined.append(ImaginedTurn(ep.turn, attempts, written, len(ep.calls), revised))

    def add_note(self, ep: Episode, attempts: list[Attempt], revised: bool) -> int:
        """Append the memory note of ``attempts`` to ``ep`` as a system turn, counted apart from its
        token budget (``Episode.note_tokens``): the attempt it informs keeps the budget it had.
        Returns the note's tokens."""
        span = ep.builder.context(self.fmt.system(self.note(attempts, revised), []))
        ep.note_tokens += span.stop - span.start
        return span.stop - span.start

    def _attempt(self, im: Episode) -> Course:
        """One imagined attempt: the turn to its end, then the copy is done."""
        yield from self.imagined.play_turn(im)
        if not im.done:
            im.finish()

    def note(self, attempts: list[Attempt], revised: bool = False) -> str:
        return render_memory(attempts, self.config.max_chars, revised)


def imagining_rollout(
    engine: Engine,
    tokenizer: Any,
    fmt: ChatFormat,
    responder: Responder,
    limits: RolloutLimits | None = None,
    config: ImaginationConfig | None = None,
    imagine: Responder | None = None,
    **kw: Any,
) -> Rollout:
    """A rollout whose every user turn is imagined first (:class:`Imagination`); ``responder``
    answers the *committed* calls (the real environment), ``imagine`` the imagined ones (default: the
    policy itself). ``kw``: as :class:`~envace.rollout.Rollout` (user, lockstep, validate_calls)."""
    config = config or ImaginationConfig()
    limits = limits or RolloutLimits()
    encode = PieceEncoder(tokenizer)
    steps = replace(limits, max_steps_per_turn=config.max_steps or limits.max_steps_per_turn)
    imagined = Rollout(engine, fmt, encode, imagine or PolicyRehearsal(), steps,
                       validate_calls=kw.get("validate_calls", True))  # fmt: skip
    hook = Imagination(imagined, config, fmt) if config.active else None
    revise = hook.revise if hook is not None and config.reimagine > 0 else None
    return Rollout(engine, fmt, encode, responder, limits, before_turn=hook, after_step=revise, **kw)


@dataclass
class TokenCounts:
    """Tokens of one committed episode by origin."""

    imagined: int = 0
    committed: int = 0
    memory: int = 0
    attempts: int = 0


def token_counts(episode: Episode) -> TokenCounts:
    """Imagined tokens (generated in imagined attempts), committed tokens (generated in the committed
    episode: act, and rehearse when the committed responder is the policy) and memory-note tokens."""
    roles = episode.role_tokens()
    return TokenCounts(
        imagined=sum(r.tokens for r in episode.imagined),
        committed=roles["act"] + roles["rehearse"],
        memory=sum(r.memory_tokens for r in episode.imagined),
        attempts=sum(len(r.attempts) for r in episode.imagined),
    )
