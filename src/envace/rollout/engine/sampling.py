"""What a generation asks for and what it returns, and the one draw every row's token comes from.

Each row draws from its episode's own random stream when the rollout gives one (``Request.rng``,
``episode.rng``): what an episode samples then does not depend on the episodes it is batched with.
:func:`draw` is a pure function of the logits, the sampling settings and those streams, so the
sampling itself can be tested without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from envace.rollout.engine.vllm.config import VLLMConfig

#: the generation engines ``sampling.engine`` names
ENGINES = ("envace", "vllm")
SAMPLING_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


@dataclass
class SamplingConfig:
    """How the policy samples.

    Args:
        temperature: softmax temperature; the recorded log-probs use the same temperature, and so
            must the loss. ``0`` decodes greedily (the most likely token; log-probs at temperature 1).
        top_p: nucleus sampling mass (1.0 = off).
        top_k: top-k sampling (0 = off).
        batch_size: most prompts generated together in one call (micro-batches beyond it).
        share_prefix: prefill the prompts' common prefix (the system turn with its tool block) once
            and reuse its KV cache across the batch and across the calls of a rollout.
        min_prefix: shortest common prefix worth sharing, in tokens.
        reuse_rows: keep each row's keys and values after a call, so that a later prompt extending
            it (the episode's next turn) prefills only its new tokens.
        row_cache_tokens: most tokens kept for ``reuse_rows``; the least recently used rows go first.
        share_identical: prefill identical prompts of a batch once (group members whose contexts have
            not diverged) and copy their keys and values to each row before the first draw.
        continuous: a generation that the end of another asks for (the episode's next turn) joins the
            running batch at once (continuous batching); ``False``: it waits until every row of the
            batch has ended, and the next turns start together (lockstep).
        dtype: ``None`` samples in the policy's own precision; ``bfloat16`` with a bfloat16 copy of
            its weights, refreshed after every update (faster on CPUs with ``avx512_bf16`` or AMX,
            and on GPUs; ~100x slower elsewhere, warned); ``auto``: bfloat16 where the device
            computes it natively, else the policy's precision (:mod:`envace.hardware`). The
            recorded log-probs are then the copy's; the loss's importance ratio corrects for the
            difference as it does for any separate sampler. Not with FSDP sharding.
        pack_weights: on CPU, sample from a copy whose linear layers hold oneDNN-prepacked weights
            (:class:`~envace.rollout.engine.PackedLinear`; LoRA adapters merged), rebuilt when the
            weights have changed. Same numbers as the policy to float rounding; 2-4x faster linear
            layers at 2-8 rows. Ignored on other devices and under FSDP sharding.
        engine: ``envace`` (default): our batched engine in this process
            (:class:`~envace.rollout.engine.GenerationEngine`); ``vllm``: a vLLM server in its own
            venv (``make vllm``) samples, the trained weights synced to it after every update
            (:class:`~envace.rollout.engine.vllm.VLLMEngine`, docs/vllm.md). The options above
            but ``temperature``, ``top_p``, ``top_k`` and ``dtype`` are our engine's.
        vllm: the vLLM server (:class:`~envace.rollout.engine.vllm.VLLMConfig`).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    batch_size: int = 16
    share_prefix: bool = True
    min_prefix: int = 64
    reuse_rows: bool = True
    row_cache_tokens: int = 32768
    share_identical: bool = True
    continuous: bool = True
    dtype: str | None = None
    pack_weights: bool = True
    engine: str = "envace"
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def __post_init__(self) -> None:
        if isinstance(self.vllm, dict):  # a config read as plain data (an experiment's base settings)
            self.vllm = VLLMConfig(**self.vllm)
        if self.engine not in ENGINES:
            raise ValueError(f"sampling.engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")


@dataclass
class Sample:
    """One generation: the sampled ids (the stop token included when it was reached)."""

    ids: list[int]
    logprobs: list[float]
    stopped: bool


@dataclass
class Request:
    """One generation asked of the engine: up to ``max_new_tokens`` after ``prompt``, each token drawn
    from ``rng`` (the episode's stream) when given; ``tag`` is the caller's. ``episode``: the episode
    the generation is for — scripted engines (reference policies) write their text from it;
    sampling engines never read it."""

    prompt: list[int]
    max_new_tokens: int
    rng: torch.Generator | None = None
    tag: Any = None
    episode: Any = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")


Follow = Callable[[Request, Sample], list[Request]]
"""Called as each request ends, with its sample: the requests its episode needs next (often none)."""


class Decoding:
    """What every sampling engine offers beside :meth:`stream`: a temperature switch for a block
    (greedy validation between training rollouts) and :meth:`generate` for callers with no
    follow-up turns."""

    sampling: SamplingConfig

    def stream(self, requests: list[Request], follow: Follow) -> None:
        raise NotImplementedError

    @contextmanager
    def decoding(self, temperature: float | None) -> Iterator[None]:
        """Sample at ``temperature`` inside the block (``None``: unchanged), e.g. greedy validation
        episodes between stochastic training rollouts; the cached keys and values stay valid."""
        saved = self.sampling
        if temperature is not None:
            self.sampling = replace(saved, temperature=temperature)
        try:
            yield
        finally:
            self.sampling = saved

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, rngs: list[torch.Generator | None] | None = None
    ) -> list[Sample]:
        """Sample up to ``max_new_tokens`` after each prompt, all prompts batched (a convenience over
        :meth:`stream` for callers with no follow-up turns).

        ``rngs``, when given, holds one random stream per prompt (an episode's ``rng``; an entry
        ``None`` draws from the global stream): each row then draws from its own stream, so what it
        samples does not depend on which other prompts share its batch.
        """
        rngs = rngs if rngs is not None else [None] * len(prompts)
        out: list[Sample] = [Sample([], [], False) for _ in prompts]

        def keep(request: Request, sample: Sample) -> list[Request]:
            out[request.tag] = sample
            return []

        requests = [Request(p, max_new_tokens, g, i) for i, (p, g) in enumerate(zip(prompts, rngs, strict=True))]
        self.stream(requests, keep)
        return out


@dataclass
class EngineStats:
    """Generated tokens and seconds spent, for ``train/rollout/tokens_per_s``.

    ``prompt_tokens`` counts the prompts' tokens; ``prefill_tokens`` the ones actually run through the
    model before sampling (the rest came from a cache); ``steps`` the model forwards that sampled a
    token for every row in the batch (``tokens / steps``: how full the batches ran).
    """

    tokens: int = 0
    seconds: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    steps: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def draw(
    logits: torch.Tensor, sampling: SamplingConfig, rngs: list[torch.Generator | None] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from ``logits [rows, vocab]`` (temperature, top-k, top-p as HF applies
    them), and its log-prob under the temperature-scaled distribution (at temperature 1 when
    ``sampling.temperature`` is 0: greedy). Returns ``(token [rows], logprob [rows])``.

    Row ``r`` draws its uniform from ``rngs[r]`` (on the CPU) when given, else from the global
    stream. One inverse-CDF draw per row: HF's multinomial draws an exponential per vocabulary entry
    (6 ms per step at batch 8).
    """
    if sampling.temperature == 0:
        token = logits.argmax(dim=-1)
        return token, torch.log_softmax(logits, dim=-1).gather(1, token[:, None]).squeeze(1)
    scores = logits / sampling.temperature
    logp = torch.log_softmax(scores, dim=-1)
    if sampling.top_k:
        kth = scores.topk(min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -torch.inf)
    if sampling.top_p < 1.0:
        ordered, order = scores.sort(dim=-1)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - sampling.top_p
        drop[:, -1] = False  # keep at least the most likely token
        scores = scores.masked_fill(drop.scatter(1, order, drop), -torch.inf)
    cdf = scores.softmax(dim=-1).cumsum(dim=-1)
    if rngs is not None and any(g is not None for g in rngs):
        draws = torch.cat([torch.rand(1, generator=g) for g in rngs])[:, None].to(cdf.device)
    else:
        draws = torch.rand(cdf.shape[0], 1, device=cdf.device)
    u = draws * cdf[:, -1:]
    token = torch.searchsorted(cdf, u).squeeze(1).clamp_max(cdf.shape[1] - 1)
    return token, logp.gather(1, token[:, None]).squeeze(1)
