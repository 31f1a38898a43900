"""Batched sampling over token-id prompts: the one generation path of the rollout.

Prompts are lists of ids (tokens in); the engine returns the sampled ids and their log-probs
(tokens out). All active episodes of a step are generated together: left padding, attention masks,
and a KV cache inside each call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache


@dataclass
class SamplingConfig:
    """How the policy samples.

    Args:
        temperature: softmax temperature; the recorded log-probs use the same temperature, and so
            must the loss.
        top_p: nucleus sampling mass (1.0 = off).
        top_k: top-k sampling (0 = off).
        batch_size: most prompts generated together in one call (micro-batches beyond it).
        share_prefix: prefill the prompts' common prefix (the system turn with its tool block) once
            and reuse its KV cache across the batch and across the calls of a rollout.
        min_prefix: shortest common prefix worth sharing, in tokens.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    batch_size: int = 16
    share_prefix: bool = True
    min_prefix: int = 64


@dataclass
class Sample:
    """One generation: the sampled ids (the stop token included when it was reached)."""

    ids: list[int]
    logprobs: list[float]
    stopped: bool


@dataclass
class EngineStats:
    """Generated tokens and seconds spent, for ``rollout/tokens_per_s``."""

    tokens: int = 0
    seconds: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Engine(Protocol):
    """What the rollout needs of a generation engine (sampling, or scripted reference policies)."""

    stats: EngineStats

    def generate(self, prompts: list[list[int]], max_new_tokens: int, episodes: Any = None) -> list[Sample]: ...

    def reset_cache(self) -> None: ...


@dataclass
class GenerationEngine:
    """Samples continuations of token prompts with a Hugging Face causal LM.

    Args:
        model: the policy (a peft model works too).
        stop_ids: token ids that end a turn (the chat format's end-of-turn token).
        pad_id: id used for left padding.
        sampling: the sampling configuration.
    """

    model: Any
    stop_ids: list[int]
    pad_id: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stats: EngineStats = field(default_factory=EngineStats)
    _prefixes: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def reset_cache(self) -> None:
        """Forget cached prefixes; call whenever the weights change (after every update)."""
        self._prefixes.clear()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, episodes: Any = None) -> list[Sample]:
        """Sample up to ``max_new_tokens`` after each prompt, all prompts batched.

        ``episodes`` (the episodes the prompts belong to) is for scripted engines; sampling ignores it.
        """
        if not prompts:
            return []
        order = sorted(range(len(prompts)), key=lambda i: (prompts[i][:32], len(prompts[i])))  # shared prefix first
        out: list[Sample | None] = [None] * len(prompts)
        bs = max(1, self.sampling.batch_size)
        for start in range(0, len(order), bs):
            chunk = order[start : start + bs]
            for i, sample in zip(chunk, self._generate_batch([prompts[i] for i in chunk], max_new_tokens), strict=True):
                out[i] = sample
        return [s for s in out if s is not None]

    def _generate_batch(self, prompts: list[list[int]], max_new_tokens: int) -> list[Sample]:
        began = time.perf_counter()
        device = next(self.model.parameters()).device
        shared = self._shared_length(prompts)
        width = max(len(p) - shared for p in prompts)
        # [shared prefix | left padding | own suffix]: pads sit after the prefix, so every position
        # attends to at least the prefix (no fully-masked rows); positions come from the mask.
        ids = torch.full((len(prompts), shared + width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, :shared] = torch.tensor(p[:shared], dtype=torch.long)
            ids[row, shared + width - (len(p) - shared) :] = torch.tensor(p[shared:], dtype=torch.long)
            mask[row, :shared] = 1
            mask[row, shared + width - (len(p) - shared) :] = 1
        kwargs: dict[str, Any] = {}
        if shared:
            kwargs["cache"] = self._prefix_cache(tuple(prompts[0][:shared]), len(prompts), device)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                top_k=self.sampling.top_k or None,
                eos_token_id=self.stop_ids,
                pad_token_id=self.pad_id,
                output_logits=True,
                return_dict_in_generate=True,
                **kwargs,
            )
        finally:
            self.model.train(was_training)
        samples = self._collect(out.sequences[:, ids.shape[1] :].cpu(), torch.stack(out.logits, dim=1).float().cpu())
        self.stats.tokens += sum(len(s.ids) for s in samples)
        self.stats.prompt_tokens += int(mask.sum()) - (len(prompts) - 1) * shared
        self.stats.seconds += time.perf_counter() - began
        self.stats.calls += 1
        return samples

    def _shared_length(self, prompts: list[list[int]]) -> int:
        """Length of the common prefix worth caching (0 when sharing is off or it is too short).

        At least one token of each prompt stays uncached, so every row produces next-token logits.
        """
        if not self.sampling.share_prefix:
            return 0
        first, n = prompts[0], min(len(p) for p in prompts) - 1
        for p in prompts[1:]:
            n = next((i for i in range(n) if p[i] != first[i]), n)
        return n if n >= self.sampling.min_prefix else 0

    def _prefix_cache(self, prefix: tuple[int, ...], batch: int, device: torch.device) -> DynamicCache:
        """A fresh KV cache holding ``prefix`` for ``batch`` rows; the prefix is prefilled once."""
        if prefix not in self._prefixes:
            if len(self._prefixes) >= 8:
                self._prefixes.pop(next(iter(self._prefixes)))
            cache = DynamicCache(config=_config(self.model))
            was_training = self.model.training
            self.model.eval()
            try:
                self.model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True)
            finally:
                self.model.train(was_training)
            self._prefixes[prefix] = [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]
        kv = self._prefixes[prefix]
        return DynamicCache(
            ddp_cache_data=[(k.expand(batch, -1, -1, -1).contiguous(), v.expand(batch, -1, -1, -1).contiguous())
                            for k, v in kv],
            config=_config(self.model),
        )  # fmt: skip

    def _collect(self, new: torch.Tensor, logits: torch.Tensor) -> list[Sample]:
        """Cut each row at its first stop token and gather the sampled ids' log-probs."""
        logp = torch.log_softmax(logits / self.sampling.temperature, dim=-1)
        chosen = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        stops = torch.isin(new, torch.tensor(self.stop_ids))
        samples = []
        for row in range(new.shape[0]):
            hit = stops[row].nonzero()
            n = int(hit[0]) + 1 if len(hit) else new.shape[1]
            samples.append(Sample(new[row, :n].tolist(), chosen[row, :n].tolist(), stopped=bool(len(hit))))
        return samples


def _config(model: Any) -> Any:
    """The transformers config of a (possibly peft-wrapped) model."""
    return getattr(model, "config", None) or model.get_base_model().config
