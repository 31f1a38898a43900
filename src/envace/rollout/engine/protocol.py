"""What the rollout needs of a generation engine: the sampling one, or a scripted reference policy."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import ClassVar, Protocol

import torch

from envace.rollout.engine.sampling import EngineStats, Follow, Request, Sample, SamplingConfig


class Engine(Protocol):
    """A generation engine as the rollout loop drives it.

    ``stream`` generates every request; as each one ends, ``follow(request, sample)`` returns the
    requests its episode needs next, which the engine generates too before returning (a batching
    engine lets them join the rows still decoding). ``instant`` engines (scripted policies whose turns
    cost nothing) are asked for each turn at once, in the episode's own course, instead of being
    batched with the others. ``reset_cache`` is called whenever the weights may have changed.
    """

    stats: EngineStats
    instant: ClassVar[bool]

    def stream(self, requests: list[Request], follow: Follow) -> None: ...

    def reset_cache(self) -> None: ...


class SamplingEngine(Engine, Protocol):
    """An engine that samples a model (ours, :class:`~envace.rollout.engine.GenerationEngine`, or a
    vLLM server's, :class:`~envace.rollout.engine.vllm.engine.VLLMEngine`): what the modules,
    evaluation and the bench use of it beside :class:`Engine`."""

    stop_ids: list[int]
    pad_id: int
    sampling: SamplingConfig

    def decoding(self, temperature: float | None) -> AbstractContextManager[None]: ...

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, rngs: list[torch.Generator | None] | None = None
    ) -> list[Sample]: ...
