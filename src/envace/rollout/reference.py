"""Reference policies that calibrate every scorer: ``oracle`` (gold calls) and ``noop`` (never calls).

They stand in for the generation engine: instead of sampling, they write a text for each episode,
tokenised like any sampled turn, so the same rollout loop, responders and scorers run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from envace.protocol import render_calls
from envace.rollout.engine import EngineStats, Sample

if TYPE_CHECKING:
    from envace.rollout.loop import Episode

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
    #: its turns cost nothing to write: the rollout writes each one as soon as the episode needs it
    instant: ClassVar[bool] = True

    def reset_cache(self) -> None:
        """Nothing is cached."""

    def text_for(self, episode: Episode) -> str:
        raise NotImplementedError

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, episodes: list[Episode] | None = None
    ) -> list[Sample]:
        if episodes is None or len(episodes) != len(prompts):
            raise ValueError("a scripted engine needs the episodes it writes for")
        samples = []
        for ep in episodes:
            ids = self.tokenizer(self.text_for(ep), add_special_tokens=False)["input_ids"][: max_new_tokens - 1]
            ids = [*ids, self.stop_ids[0]]
            samples.append(Sample(ids, [0.0] * len(ids), stopped=True))
            self.stats.tokens += len(ids)
        return samples


class OracleEngine(ScriptedEngine):
    """Writes each user turn's gold calls in one act step, then a closing text."""

    def text_for(self, episode: Episode) -> str:
        if episode.scratch.get("oracle_turn") == episode.turn:
            return DONE
        episode.scratch["oracle_turn"] = episode.turn
        gold = episode.task.gold[episode.turn] if episode.turn < len(episode.task.gold) else []
        return render_calls("", list(gold)) if gold else DONE


class NoopEngine(ScriptedEngine):
    """Never calls a tool."""

    def text_for(self, episode: Episode) -> str:
        return NOOP
