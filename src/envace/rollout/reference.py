"""Reference policies that calibrate every scorer: ``oracle`` (gold calls) and ``noop`` (never calls).

They stand in for the generation engine: instead of sampling, they write a text for each episode,
tokenised like any sampled turn, so the same rollout loop, responders and scorers run unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from envace.envs import documented_calls
from envace.protocol import render_calls
from envace.protocol.render import ChatFormat
from envace.protocol.tokens import PieceEncoder
from envace.rollout.engine import EngineStats, Follow, Request, Sample
from envace.rollout.loop import Rollout, RolloutLimits
from envace.rollout.responders import Responder
from envace.types import ToolCall

if TYPE_CHECKING:
    from envace.rollout.episode import Episode

DONE = "Done."
NOOP = "I cannot help with that."


@dataclass
class ScriptedEngine:
    """An engine whose "samples" are texts chosen per episode (log-prob 0 for every token).

    Args:
        tokenizer: the policy's tokenizer.
        stop_ids: the end-of-turn ids; the first is appended to every text.
    """

    tokenizer: Any
    stop_ids: list[int]
    stats: EngineStats = field(default_factory=EngineStats)
    #: its turns cost nothing to write: the rollout asks for each one as soon as the episode needs it
    instant: ClassVar[bool] = True

    def reset_cache(self) -> None:
        """Nothing is cached."""

    def text_for(self, episode: Episode) -> str:
        raise NotImplementedError

    def stream(self, requests: list[Request], follow: Follow) -> None:
        """Write every request, round by round: the requests that a round's ends ask for are the next."""
        while requests:
            samples = self.write(requests)
            requests = [nxt for r, s in zip(requests, samples, strict=True) for nxt in follow(r, s)]

    def write(self, requests: list[Request]) -> list[Sample]:
        """One round: each request's text (:meth:`text_for` its episode), cut to its budget and ended."""
        samples = []
        for request in requests:
            if request.episode is None:
                raise ValueError("a scripted engine writes for episodes: the request names none")
            text = self.text_for(request.episode)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: request.max_new_tokens - 1]
            ids = [*ids, self.stop_ids[0]]
            samples.append(Sample(ids, [0.0] * len(ids), stopped=True))
            self.stats.tokens += len(ids)
        return samples


def calls_once_per_turn(episode: Episode, calls: Sequence[ToolCall]) -> str:
    """A scripted act: ``calls`` at the first act step of the user turn, then the closing text
    :data:`DONE` (every scripted reference policy writes its calls this way)."""
    return render_calls("", list(calls)) if calls and episode.steps_in_turn == 0 else DONE


def gold_calls(episode: Episode) -> list[ToolCall]:
    """The gold calls of the episode's current user turn (none past the gold), under the names the
    policy's docs show (:func:`~envace.envs.documented_calls`: a documented drift's new tool names)."""
    gold = episode.task.gold
    return documented_calls(episode.task, gold[episode.turn]) if episode.turn < len(gold) else []


def calls_one_per_step(episode: Episode, calls: Sequence[ToolCall]) -> str:
    """A scripted act: the turn's ``k``-th call at its ``k``-th act step, then the closing text
    :data:`DONE`: the layout of every grounded training episode (:func:`~envace.data.grounding.ground`)."""
    step = episode.steps_in_turn
    return render_calls("", [calls[step]]) if step < len(calls) else DONE


class OracleEngine(ScriptedEngine):
    """Writes each user turn's gold calls in one act step, then a closing text."""

    def text_for(self, episode: Episode) -> str:
        return calls_once_per_turn(episode, gold_calls(episode))


class StepOracleEngine(ScriptedEngine):
    """Writes each user turn's gold calls one an act step, then a closing text: each call's response is
    answered before the next call is in the context."""

    def text_for(self, episode: Episode) -> str:
        return calls_one_per_step(episode, gold_calls(episode))


class NoopEngine(ScriptedEngine):
    """Never calls a tool."""

    def text_for(self, episode: Episode) -> str:
        return NOOP


#: how the gold oracle lays out a turn's calls: ``turn`` all in one act step (each rehearsal then sees the
#: turn's later gold calls, chosen from the real answers), ``call`` one an act step (the training layout)
ORACLES: dict[str, type[ScriptedEngine]] = {"turn": OracleEngine, "call": StepOracleEngine}


def check_layout(layout: str) -> None:
    """Refuse a gold layout that is not one of :data:`ORACLES`, in one line."""
    if layout not in ORACLES:
        raise ValueError(f"gold layout must be one of {', '.join(ORACLES)}, got {layout!r}")


def gold_rollout(
    tokenizer: Any,
    fmt: ChatFormat,
    stop_ids: list[int],
    rehearsal: Responder,
    limits: RolloutLimits,
    layout: str = "call",
) -> Rollout:
    """A rollout whose acts are the gold calls (the oracle) and whose tool turns ``rehearsal`` writes,
    beside a lockstep real environment: rehearsal fidelity on the calls that matter, whatever the
    policy would have called. ``layout`` (:data:`ORACLES`) places the calls, by default as training
    episodes have them (``call``: a ``turn`` rehearsal sees the turn's later gold calls, a leak, in a
    layout training never shows); the oracle's act budget is lifted (whole turns, or as many steps as
    the gold has calls)."""
    check_layout(layout)
    limits = dataclasses.replace(limits, max_new_tokens=4096, max_calls_per_step=64, max_steps_per_turn=64,
                                 max_episode_tokens=limits.max_episode_tokens * 4)  # fmt: skip
    oracle = ORACLES[layout](tokenizer, stop_ids)
    return Rollout(oracle, fmt, PieceEncoder(tokenizer), rehearsal, limits, lockstep=True, validate_calls=False)
