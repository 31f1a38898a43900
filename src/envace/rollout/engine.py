"""Batched sampling over token-id prompts: the one generation path of the rollout.

Prompts are lists of ids (tokens in); the engine returns the sampled ids and their log-probs
(tokens out). All active episodes of a step are generated together: left padding, attention masks,
and a KV cache inside each call. Keys and values are reused wherever they are already known:

* the **shared prefix** (the system turn with its tool block, identical across a group's episodes)
  is prefilled once per rollout and expanded to every row;
* each **row's own** keys and values (its prompt and what it generated) are kept after a call, so
  the same episode's next call (the rehearsal after an act, the next act after a tool turn)
  prefills only the tokens appended since, not its whole history again;
* within a call, new keys and values are written into storage sized for the whole generation
  (:class:`GrowingLayer`) instead of being concatenated onto the cache at every step;
* **identical prompts** in a batch (group members whose contexts have not diverged) are prefilled
  once and copied to each row before the first draw.

Each row draws from its episode's own random stream when the rollout gives one (``episode.rng``):
what an episode samples then does not depend on the episodes it is batched with.

On CPUs the engine samples from a copy of the policy whose linear layers hold their weights
prepacked for oneDNN (:class:`PackedLinear`, LoRA merged, rebuilt after every update): a linear
layer then costs about the same for 1 to 8 rows, where the plain fp32 GEMM of 2 or 8 rows costs 2-3x
one row (``SamplingConfig.pack_weights``). ``SamplingConfig.dtype`` can make that copy bfloat16: on
CPUs with ``avx512_bf16``/AMX its matmuls are faster still.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [rows, kv_heads, tokens, head_dim]


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
        dtype: ``None`` samples in the policy's own precision; ``bfloat16`` with a bfloat16 copy of
            its weights, refreshed after every update (faster on CPUs with ``avx512_bf16`` or AMX,
            and on GPUs). The recorded log-probs are then the copy's; the loss's importance ratio
            corrects for the difference as it does for any separate sampler. Not with FSDP sharding.
        pack_weights: on CPU, sample from a copy whose linear layers hold oneDNN-prepacked weights
            (:class:`PackedLinear`; LoRA adapters merged), rebuilt when the weights have changed.
            Same numbers as the policy to float rounding; 2-4x faster linear layers at 2-8 rows.
            Ignored on other devices and under FSDP sharding.
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
    dtype: str | None = None
    pack_weights: bool = True


@dataclass
class Sample:
    """One generation: the sampled ids (the stop token included when it was reached)."""

    ids: list[int]
    logprobs: list[float]
    stopped: bool


@dataclass
class EngineStats:
    """Generated tokens and seconds spent, for ``rollout/tokens_per_s``.

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


class Engine(Protocol):
    """What the rollout needs of a generation engine (sampling, or scripted reference policies)."""

    stats: EngineStats

    def generate(self, prompts: list[list[int]], max_new_tokens: int, episodes: Any = None) -> list[Sample]: ...

    def reset_cache(self) -> None: ...


class PackedLinear(torch.nn.Module):
    """A linear layer for sampling on CPU, its weight prepacked once for oneDNN.

    ``F.linear`` hands MKL the weight in its plain layout, and MKL's fp32 GEMM re-packs it at every
    call: with 2-8 rows (a decoding step of a small batch) that costs 2-3x one row, and the LM head of
    a 49k vocabulary 1.6-2x. With the weight prepacked (``mkldnn._reorder_linear_weight``), 1, 2 and 8
    rows cost about the same, and one row is faster too (``docs/performance.md``). Inference only.

    Args:
        linear: the layer to pack (its weight and bias are copied; the layer is not kept).
        rows: the row count the packing is tuned for (any count works).
    """

    def __init__(self, linear: torch.nn.Linear, rows: int = 8) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    @staticmethod
    def available(model: Any) -> bool:
        """Whether ``model`` can sample through packed layers: oneDNN present, plain CPU tensors, no
        FSDP wrapping (a sharded model samples with its gathered weights, see ``modules.unsharded``)."""
        params = list(model.parameters())
        return (
            torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and all(p.device.type == "cpu" and type(p).__name__ != "DTensor" for p in params)
            and not any(type(m).__name__.startswith("FSDP") for m in model.modules())
        )


def packed_copy(model: Any, dtype: torch.dtype) -> Any:
    """A frozen copy of ``model`` in ``dtype`` for sampling: LoRA adapters merged into the weights,
    every ``nn.Linear`` replaced by a :class:`PackedLinear`."""
    clone = copy.deepcopy(model)
    for p in clone.parameters():
        p.grad = None  # the policy's gradients are not the copy's business
    if hasattr(clone, "merge_and_unload"):  # a peft model: W + scale * B @ A, adapters dropped
        clone = clone.merge_and_unload()
    clone = clone.to(dtype).requires_grad_(False).eval()
    for module in list(clone.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))
    return clone


class GrowingLayer(DynamicLayer):
    """A KV-cache layer that writes new keys and values in place.

    ``DynamicLayer`` concatenates at every step, copying the whole cache each time: with a batch of
    8 and 600 cached tokens that copy was a third of a decoding step. Here storage is allocated once
    (``capacity``, doubled if ever exceeded) and ``keys``/``values`` are views of its filled part.

    Args:
        capacity: tokens to allocate for at the first write.
    """

    def __init__(self, capacity: int = 0) -> None:
        super().__init__()
        self.capacity = capacity
        self._store: tuple[torch.Tensor, torch.Tensor] | None = None
        self._view: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None
        n, add = self.get_seq_length(), key_states.shape[-2]
        if self._store is None or self.keys is not self._view or n + add > self._store[0].shape[-2]:
            # first write, full storage, or keys replaced by another method (crop, batch select)
            rows, heads, _, dim = key_states.shape
            cap = max(self.capacity, n + add, 2 * n)
            k = key_states.new_empty(rows, heads, cap, dim)
            v = value_states.new_empty(rows, heads, cap, value_states.shape[-1])
            if n:
                k[:, :, :n], v[:, :, :n] = self.keys, self.values
            self._store = (k, v)
        k, v = self._store
        k[:, :, n : n + add], v[:, :, n : n + add] = key_states, value_states
        self.keys, self.values = k[:, :, : n + add], v[:, :, : n + add]
        self._view = self.keys
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``, in storage of the same capacity."""
        if self._store is None or self.keys is not self._view:
            return super().batch_select_indices(indices)
        n = self.get_seq_length()
        k, v = self._store
        keys, values = k.new_empty(len(indices), *k.shape[1:]), v.new_empty(len(indices), *v.shape[1:])
        keys[:, :, :n], values[:, :, :n] = k[indices, :, :n], v[indices, :, :n]
        self.hold(keys, values, n)

    def hold(self, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        """Adopt ``keys``/``values`` (``[rows, heads, capacity, dim]``) as storage, first ``n`` tokens filled."""
        self.lazy_initialization(keys, values)
        self._store = (keys, values)
        self.keys, self.values = keys[:, :, :n], values[:, :, :n]
        self._view = self.keys


@dataclass
class _Layout:
    """Where each row's cached part and new part sit in one call's batch.

    Row ``i`` is ``[pad | cached_i | pad | new_i]``: its cached keys end at column ``cached`` and its
    new tokens at column ``cached + width``; positions come from the attention mask.
    """

    cached: int
    width: int
    lengths: list[int]  # cached tokens per row
    news: list[int]  # new (prefilled) tokens per row

    def row_index(self, row: int, generated: int) -> torch.Tensor:
        """Columns of row ``row``'s real tokens in the cache, ``generated`` sampled tokens included."""
        c, w = self.lengths[row], self.news[row]
        end = self.cached + self.width
        return torch.cat([torch.arange(self.cached - c, self.cached), torch.arange(end - w, end + generated)])


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
    _prefixes: dict[tuple[int, ...], KV] = field(default_factory=dict)
    _rows: OrderedDict[tuple[int, ...], KV] = field(default_factory=OrderedDict)
    _copy: Any = None
    _copy_stale: bool = True
    _copy_of: tuple[int, ...] = ()

    def reset_cache(self) -> None:
        """Forget cached keys and values; call whenever the weights change (after every update)."""
        self._prefixes.clear()
        self._rows.clear()
        self._copy_stale = True

    def sampler(self) -> Any:
        """The model that samples: the policy itself, or a copy of it — prepacked
        (``sampling.pack_weights``, on CPU) and/or in ``sampling.dtype``. The copy follows the
        policy's weights at the first call after :meth:`reset_cache` when they have changed since
        it was made (their in-place version counters tell)."""
        params = list(self.model.parameters())
        own = params[0].dtype
        dtype = SAMPLING_DTYPES[self.sampling.dtype] if self.sampling.dtype else own
        pack = self.sampling.pack_weights and PackedLinear.available(self.model)
        if dtype == own and not pack:
            return self.model
        if any(type(p).__name__ == "DTensor" for p in params):
            raise ValueError("sampling.dtype needs unsharded weights (it keeps a copy); leave it unset under FSDP")
        version = tuple(p._version for p in params)
        if self._copy is None or (self._copy_stale and version != self._copy_of):
            with torch.no_grad():
                if pack:  # rebuilt (0.4-0.6 s for SmolLM2-135M): merging LoRA needs a fresh copy anyway
                    self._copy = packed_copy(self.model, dtype)
                elif self._copy is None:
                    self._copy = copy.deepcopy(self.model).to(dtype).requires_grad_(False).eval()
                else:
                    for mine, theirs in zip(self._copy.parameters(), params, strict=True):
                        mine.copy_(theirs)
            config = _config(self._copy)
            if dtype == torch.bfloat16 and config._attn_implementation == "sdpa":
                config._attn_implementation = "envace_sdpa"
            self._copy_of = version
        self._copy_stale = False
        return self._copy

    @contextmanager
    def decoding(self, temperature: float | None) -> Iterator[None]:
        """Sample at ``temperature`` inside the block (``None``: unchanged), e.g. greedy validation
        episodes between stochastic training rollouts; the cached keys and values stay valid."""
        saved = self.sampling
        if temperature is not None:
            self.sampling = dataclasses.replace(saved, temperature=temperature)
        try:
            yield
        finally:
            self.sampling = saved

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, episodes: Any = None) -> list[Sample]:
        """Sample up to ``max_new_tokens`` after each prompt, all prompts batched.

        ``episodes`` (the episodes the prompts belong to), when given, lend their random streams
        (``episode.rng``, a ``torch.Generator``): each row then draws from its own episode's stream,
        so what an episode samples does not depend on which other episodes share its batch.
        Scripted engines read the episodes to write their texts.
        """
        if not prompts:
            return []
        order = sorted(range(len(prompts)), key=lambda i: (prompts[i][:32], len(prompts[i])))  # shared prefix first
        out: list[Sample | None] = [None] * len(prompts)
        bs = max(1, self.sampling.batch_size)
        rngs = [getattr(e, "rng", None) for e in episodes] if episodes is not None else [None] * len(prompts)
        model = self.sampler()
        was_training = model.training
        model.eval()
        # the sampler's precision is ``sampling.dtype``, whatever autocast the caller runs under
        # (Lightning's bf16-mixed wraps training_step, rollouts included: re-casting every weight
        # at every decoding step made sampling slower than fp32)
        device_type = next(model.parameters()).device.type
        try:
            with torch.autocast(device_type, enabled=False):
                for start in range(0, len(order), bs):
                    chunk = order[start : start + bs]
                    samples = self._generate_batch(
                        model, [prompts[i] for i in chunk], max_new_tokens, [rngs[i] for i in chunk]
                    )
                    for i, sample in zip(chunk, samples, strict=True):
                        out[i] = sample
        finally:
            model.train(was_training)
        return [s for s in out if s is not None]

    def _generate_batch(
        self, model: Any, prompts: list[list[int]], max_new_tokens: int, rngs: list[torch.Generator | None]
    ) -> list[Sample]:
        """One batch: identical prompts (episodes whose contexts have not diverged, e.g. a group's
        members that made the same call) are prefilled once, then every row samples on its own."""
        began = time.perf_counter()
        device = next(model.parameters()).device
        source, unique = list(range(len(prompts))), prompts  # each prompt's row, the rows' prompts
        if self.sampling.share_identical:
            first: dict[tuple[int, ...], int] = {}
            source = [first.setdefault(tuple(p), len(first)) for p in prompts]
            unique = [list(key) for key in first]
        parts = self._cached_parts(model, unique, device)
        cached = [len(p[0]) if p else 0 for p in parts]
        news = [len(q) - c for q, c in zip(unique, cached, strict=True)]
        once = _Layout(cached=max(cached), width=max(news), lengths=cached, news=news)
        ids, mask = self._inputs(unique, once)
        cache = self._batch_cache(parts, once, once.cached + once.width + max_new_tokens, device)
        layout = _Layout(once.cached, once.width, [cached[u] for u in source], [news[u] for u in source])
        expand = None if len(unique) == len(prompts) else torch.tensor(source, device=device)
        samples = self._decode(
            model, prompts, ids.to(device), mask.to(device), cache, layout, max_new_tokens, rngs, expand
        )
        self.stats.tokens += sum(len(s.ids) for s in samples)
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        self.stats.prefill_tokens += sum(news)
        self.stats.seconds += time.perf_counter() - began
        self.stats.calls += 1
        return samples

    def _cached_parts(
        self, model: Any, prompts: list[list[int]], device: torch.device
    ) -> list[tuple[tuple[int, ...], KV] | None]:
        """Per prompt, ``(cached ids, their keys and values [1, ...])`` or ``None``: the longest kept
        row or prefix that starts it, else the prefix that two or more rows without one share."""
        parts: list[tuple[tuple[int, ...], KV] | None] = [self._hit(p) for p in prompts]
        missing = [p for p, hit in zip(prompts, parts, strict=True) if hit is None]
        shared = self._shared_length(missing) if len(missing) > 1 else 0
        if shared:
            prefix = tuple(missing[0][:shared])
            kv = self._prefix_kv(model, prefix, device)
            parts = [hit if hit is not None else (prefix, kv) for hit in parts]
        for key in {h[0] for h in parts if h is not None and h[0] in self._rows}:
            self._rows.pop(key)  # extended by this call: the longer row replaces it
        return parts

    def _hit(self, prompt: list[int]) -> tuple[tuple[int, ...], KV] | None:
        """The longest kept row or prefix that is a proper prefix of ``prompt``."""
        best: tuple[tuple[int, ...], KV] | None = None
        for store in (self._rows, self._prefixes) if self.sampling.reuse_rows else (self._prefixes,):
            for key, kv in store.items():
                n = len(key)
                longer = n < len(prompt) and (best is None or n > len(best[0]))
                if longer and prompt[n - 1] == key[-1] and tuple(prompt[:n]) == key:
                    best = (key, kv)
        return best

    def _inputs(self, prompts: list[list[int]], layout: _Layout) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``attention_mask`` of the batch, ``[rows, cached + width]``."""
        ids = torch.full((len(prompts), layout.cached + layout.width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            c, end = layout.lengths[row], layout.cached + layout.width
            ids[row, layout.cached - c : layout.cached] = torch.tensor(p[:c], dtype=torch.long)
            ids[row, end - layout.news[row] :] = torch.tensor(p[c:], dtype=torch.long)
            mask[row, layout.cached - c : layout.cached] = 1
            mask[row, end - layout.news[row] :] = 1
        return ids, mask

    def _batch_cache(
        self, parts: list[tuple[tuple[int, ...], KV] | None], layout: _Layout, capacity: int, device: torch.device
    ) -> DynamicCache:
        """A cache holding each row's cached part right-aligned at column ``cached``: of
        :class:`GrowingLayer` (storage for ``capacity`` tokens) when the model's layers are plain."""
        config = _config(self.model)
        growing = all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)
        size = capacity if growing else layout.cached
        data: KV = []
        some = next((p[1] for p in parts if p is not None), None)
        for i, (k0, v0) in enumerate(some if some is not None and layout.cached else []):
            k = k0.new_zeros(len(parts), k0.shape[1], size, k0.shape[3], device=device)
            v = v0.new_zeros(len(parts), v0.shape[1], size, v0.shape[3], device=device)
            for row, part in enumerate(parts):
                if part is not None:
                    cols = slice(layout.cached - layout.lengths[row], layout.cached)
                    k[row, :, cols], v[row, :, cols] = part[1][i][0][0], part[1][i][1][0]
            data.append((k, v))
        if not growing:  # sliding-window or other special layers: the default cache
            return DynamicCache(ddp_cache_data=data or None, config=config)
        cache = DynamicCache(config=config)
        layers = [GrowingLayer(capacity) for _ in cache.layers]
        for layer, (k, v) in zip(layers, data, strict=False):
            layer.hold(k, v, layout.cached)
        cache.layers = list(layers)
        return cache

    def _keep_rows(
        self, cache: Any, rows: list[tuple[int, int]], prompts: list[list[int]], samples: list[Sample], layout: _Layout
    ) -> None:
        """Keep the keys and values of ``rows`` (``(batch row, prompt index)`` pairs): the prompt and
        the sample but its last token (never fed)."""
        layers = cache.layers
        if not self.sampling.reuse_rows or not all(isinstance(layer, GrowingLayer) for layer in layers):
            return
        for row, i in rows:
            ids = samples[i].ids
            index = layout.row_index(i, len(ids) - 1).to(layers[0].keys.device)
            kv = [(layer.keys[row : row + 1, :, index], layer.values[row : row + 1, :, index]) for layer in layers]
            self._rows[tuple(prompts[i] + ids[:-1])] = kv
        total = sum(len(k) for k in self._rows)
        while total > self.sampling.row_cache_tokens and self._rows:
            total -= len(self._rows.popitem(last=False)[0])

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

    def _prefix_kv(self, model: Any, prefix: tuple[int, ...], device: torch.device) -> KV:
        """The keys and values of ``prefix`` (one row), prefilled on first use."""
        if prefix not in self._prefixes:
            if len(self._prefixes) >= 8:
                self._prefixes.pop(next(iter(self._prefixes)))
            cache = DynamicCache(config=_config(model))
            model(input_ids=torch.tensor([prefix], device=device), cache=cache, use_cache=True, logits_to_keep=1)
            self._prefixes[prefix] = [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]
            self.stats.prefill_tokens += len(prefix)
        return self._prefixes[prefix]

    def _decode(
        self,
        model: Any,
        prompts: list[list[int]],
        ids: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        layout: _Layout,
        max_new_tokens: int,
        rngs: list[torch.Generator | None],
        expand: torch.Tensor | None = None,
    ) -> list[Sample]:
        """Prefill the uncached columns of ``ids`` onto ``cache``, then sample one token per row and step.

        ``ids``, ``mask`` and ``cache`` hold one row per distinct prompt; ``expand`` (prompt → row),
        when some prompts repeat, copies the prefilled rows to one per prompt before the first draw.
        A plain loop over the model (positions from the mask, as ``generate`` computes them): per
        step one forward with the new tokens and one draw per row by inverse CDF (HF's multinomial
        draws an exponential per vocabulary entry: 6 ms per step at batch 8). When a quarter of the
        rows still in the batch have stopped, their keys and values are kept and the rows leave the
        batch, so the rest decode at a smaller batch.
        """
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        step_ids, step_pos = ids[:, layout.cached :], positions[:, layout.cached :]
        stops = set(self.stop_ids)
        rows = list(range(len(prompts)))  # prompt index of each batch row
        out = [Sample([], [], stopped=False) for _ in prompts]
        for step in range(max_new_tokens):
            logits = model(
                input_ids=step_ids, attention_mask=mask, position_ids=step_pos, cache=cache, use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1].float()  # fmt: skip
            self.stats.steps += 1
            if step == 0 and expand is not None:
                for layer in cache.layers:
                    layer.batch_select_indices(expand)
                logits, mask, step_pos = logits[expand], mask[expand], step_pos[expand]
            token, logprob = self._draw(logits, [rngs[i] for i in rows])
            for i, t, lp in zip(rows, token.tolist(), logprob.tolist(), strict=True):
                if not out[i].stopped:
                    out[i].ids.append(t)
                    out[i].logprobs.append(lp)
                    out[i].stopped = t in stops
            finished = [b for b, i in enumerate(rows) if out[i].stopped]
            if len(finished) == len(rows) or step + 1 == max_new_tokens:
                break
            if 4 * len(finished) >= len(rows):
                self._keep_rows(cache, [(b, rows[b]) for b in finished], prompts, out, layout)
                keep = [b for b in range(len(rows)) if b not in set(finished)]
                index = torch.tensor(keep, device=ids.device)
                for layer in cache.layers:
                    layer.batch_select_indices(index)
                mask, token, step_pos, rows = mask[index], token[index], step_pos[index], [rows[b] for b in keep]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            step_ids, step_pos = token[:, None], step_pos[:, -1:] + 1
        self._keep_rows(cache, list(enumerate(rows)), prompts, out, layout)
        return out

    def _draw(
        self, logits: torch.Tensor, rngs: list[torch.Generator | None] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row from ``logits [rows, vocab]`` (temperature, top-k, top-p as HF applies
        them), and its log-prob under the temperature-scaled distribution. Row ``r`` draws its
        uniform from ``rngs[r]`` (on the CPU) when given, else from the global stream."""
        if self.sampling.temperature == 0:
            token = logits.argmax(dim=-1)
            return token, torch.log_softmax(logits, dim=-1).gather(1, token[:, None]).squeeze(1)
        scores = logits / self.sampling.temperature
        logp = torch.log_softmax(scores, dim=-1)
        if self.sampling.top_k:
            kth = scores.topk(min(self.sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, -torch.inf)
        if self.sampling.top_p < 1.0:
            ordered, order = scores.sort(dim=-1)
            drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1 - self.sampling.top_p
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


def _packed_sdpa(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, None]:
    """HF's SDPA attention, kept off the grouped-query (``enable_gqa``) kernel for one query token.

    Without a mask HF decodes through ``enable_gqa``, which on CPUs is ~8× slower in bfloat16 than
    the packed layout it uses when a mask is given (3.7 ms vs 0.47 ms per layer, batch 8, 600
    cached tokens); an all-true mask sends every decoding step the packed way.
    """
    if query.shape[2] == 1 and attention_mask is None:
        attention_mask = torch.ones(1, 1, 1, key.shape[2], dtype=torch.bool, device=query.device)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register("envace_sdpa", _packed_sdpa)
AttentionMaskInterface.register("envace_sdpa", sdpa_mask)
SAMPLING_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


def _config(model: Any) -> Any:
    """The transformers config of a (possibly peft-wrapped) model."""
    return getattr(model, "config", None) or model.get_base_model().config
