"""The generation engine: one running batch, decoded continuously, over a sampling copy of the policy.

Generations run in one batch with left padding, attention masks and a KV cache, and
**continuously** (:meth:`GenerationEngine.stream`): when a row ends, the generation its episode needs
next (the rehearsal after an act, the next act after a tool turn) is prefilled and joins the rows
still decoding, instead of waiting for the longest of them (``SamplingConfig.continuous``).
**Identical prompts** in a batch (group members whose contexts have not diverged) are prefilled once
and copied to each row before it joins; what any prompt shares with a kept row or prefix
(:class:`~envace.rollout.engine.kept.KeptKV`) is not run again.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from transformers import DynamicCache

from envace import hardware
from envace.policy import cache_kwarg, model_config
from envace.rollout.engine.batch import Batch, Row, join
from envace.rollout.engine.kept import KeptKV
from envace.rollout.engine.kv import KV, Layout, Part, batch_cache, batch_inputs, plain_layers
from envace.rollout.engine.packed import PackedLinear, packed_copy, register_attention
from envace.rollout.engine.sampling import (
    SAMPLING_DTYPES,
    Decoding,
    EngineStats,
    Follow,
    Request,
    Sample,
    SamplingConfig,
    draw,
)


@dataclass
class GenerationEngine(Decoding):
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
    kept: KeptKV = field(default_factory=KeptKV)
    _copy: Any = None
    _copy_stale: bool = True
    _copy_of: tuple[int, ...] = ()
    _warned: bool = False
    instant: ClassVar[bool] = False  # a model's turns cost forwards: the rollout batches them (see Engine)

    def reset_cache(self) -> None:
        """Forget cached keys and values; call whenever the weights change (after every update)."""
        self.kept.clear()
        self._copy_stale = True

    def sampler(self) -> Any:
        """The model that samples: the policy itself, or a copy of it — prepacked
        (``sampling.pack_weights``, on CPU) and/or in ``sampling.dtype``. The copy follows the
        policy's weights at the first call after :meth:`reset_cache` when they have changed since
        it was made (their in-place version counters tell)."""
        params = list(self.model.parameters())
        own = params[0].dtype
        dtype = self.sampling_dtype(params[0].device.type)
        pack = self.sampling.pack_weights and PackedLinear.available(self.model, dtype)
        if dtype == own and not pack:
            return self.model
        if any(type(p).__name__ == "DTensor" for p in params):
            raise ValueError("sampling.dtype needs unsharded weights (it keeps a copy); leave it unset under FSDP")
        version = tuple(p._version for p in params)
        if self._copy is None or (self._copy_stale and version != self._copy_of):
            with torch.no_grad():
                if pack:  # rebuilt (0.4-0.6 s for SmolLM2-135M): merging LoRA needs a fresh copy anyway
                    self._copy = None  # the stale copy goes first: never two copies alive at once
                    self._copy = packed_copy(self.model, dtype)
                elif self._copy is None:
                    self._copy = copy.deepcopy(self.model).to(dtype).requires_grad_(False).eval()
                else:
                    for mine, theirs in zip(self._copy.parameters(), params, strict=True):
                        mine.copy_(theirs)
            config = model_config(self._copy)
            if dtype == torch.bfloat16 and config._attn_implementation == "sdpa":
                config._attn_implementation = register_attention()
            self._copy_of = version
        self._copy_stale = False
        return self._copy

    def sampling_dtype(self, device: str = "cpu") -> torch.dtype:
        """The dtype the sampler runs in: ``sampling.dtype`` with ``auto`` resolved for ``device``
        (:func:`envace.hardware.sampling_dtype`), else the policy's own. An explicit bfloat16 on a
        CPU without native bf16 is warned about once."""
        name = hardware.sampling_dtype(self.sampling.dtype, device)
        hardware.announce(hardware.describe("sampling.dtype", self.sampling.dtype, name or "policy's own", device))
        if name is None:
            return next(self.model.parameters()).dtype
        if name not in SAMPLING_DTYPES:
            raise ValueError(f"sampling.dtype={name!r}: expected auto, float32 or bfloat16")
        if not self._warned and self.sampling.dtype != "auto":
            hardware.warn_if_slow("sampling.dtype", name, device)
            self._warned = True
        return SAMPLING_DTYPES[name]

    @torch.no_grad()
    def stream(self, requests: list[Request], follow: Follow) -> None:
        """Generate every request in one running batch. As each one ends, ``follow(request, sample)``
        may ask for more, and those join the batch at once (continuous batching: an episode's next
        turn need not wait for the other rows' generations to end).

        At most ``sampling.batch_size`` rows decode together; further requests wait for a free slot
        (with ``sampling.continuous`` off, for the batch to end).
        New requests are prefilled together in a forward of their own (identical prompts once, the
        cached part of each not run again), then written into free slots of the running batch. A row
        that ends frees its slot and keeps its keys and values for its episode's next turn; free slots
        that no waiting request fills are dropped.
        """
        if not requests:
            return
        model = self.sampler()
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        queue = deque(sorted(requests, key=lambda r: (r.prompt[:32], len(r.prompt))))  # shared prefix first
        bs = max(1, self.sampling.batch_size)
        began, outside = time.perf_counter(), 0.0
        run: Batch | None = None
        # the sampler's precision is ``sampling.dtype``, whatever autocast the caller runs under
        # (Lightning's bf16-mixed wraps training_step, rollouts included: re-casting every weight
        # at every decoding step made sampling slower than fp32)
        try:
            with torch.autocast(device.type, enabled=False):
                while queue or (run is not None and run.live):
                    live = len(run.live) if run is not None else 0
                    joins = run is not None and run.growing and self.sampling.continuous
                    if queue and live < bs and (run is None or not live or joins):
                        joining = [queue.popleft() for _ in range(min(bs - live, len(queue)))]
                        run = join(run, self._prefill(model, joining, device))
                    else:
                        assert run is not None
                        self._step(model, run)
                    for slot in [s for s, row in enumerate(run.rows) if row is not None and row.ended]:
                        row = self._leave(run, slot)
                        began_follow = time.perf_counter()
                        queue.extend(follow(row.request, row.sample))
                        outside += time.perf_counter() - began_follow
                    if not queue:
                        run.compact()
        finally:
            model.train(was_training)
            self.stats.seconds += time.perf_counter() - began - outside

    def _prefill(self, model: Any, requests: list[Request], device: torch.device) -> Batch:
        """Prefill ``requests`` together and draw their first tokens (positions from the mask, as HF's
        ``generate`` computes them). Identical prompts (episodes whose contexts have not diverged, e.g.
        a group's members that made the same call) are run once: their rows share that cache row until
        :func:`~envace.rollout.engine.batch.join` copies it to each; every row draws on its own."""
        prompts = [r.prompt for r in requests]
        source, unique = list(range(len(prompts))), prompts  # each prompt's row, the rows' prompts
        if self.sampling.share_identical:
            first: dict[tuple[int, ...], int] = {}
            source = [first.setdefault(tuple(p), len(first)) for p in prompts]
            unique = [list(key) for key in first]
        parts = self._cached_parts(model, unique, device)
        layout = Layout.of(unique, parts)
        ids, mask = batch_inputs(unique, layout, self.pad_id)
        ids, mask = ids.to(device), mask.to(device)
        cache = batch_cache(parts, layout, max(r.max_new_tokens for r in requests), model_config(self.model), device)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        logits = model(
            input_ids=ids[:, layout.cached :], attention_mask=mask, position_ids=positions[:, layout.cached :],
            **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1,
        ).logits[:, -1].float()  # fmt: skip
        shared = len(unique) < len(prompts)
        if shared:
            expand = torch.tensor(source, device=device)
            logits, mask, positions = logits[expand], mask[expand], positions[expand]
        token, logprob = draw(logits, self.sampling, [r.rng for r in requests])
        stops = set(self.stop_ids)
        rows: list[Row | None] = [
            Row(r, Sample([t], [lp], stopped=t in stops))
            for r, t, lp in zip(requests, token.tolist(), logprob.tolist(), strict=True)
        ]
        self.stats.calls += 1
        self.stats.steps += 1
        self.stats.tokens += len(rows)
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        self.stats.prefill_tokens += sum(layout.news)
        return Batch(cache, mask, positions[:, -1] + 1, token, rows, source if shared else None)

    def _step(self, model: Any, run: Batch) -> None:
        """One decoding step: feed every slot its last token, draw the next one for the live rows."""
        mask = torch.cat([run.mask, run.mask.new_ones(len(run.rows), 1)], dim=1)
        logits = model(
            input_ids=run.token[:, None], attention_mask=mask, position_ids=run.pos[:, None],
            **cache_kwarg(model, run.cache),
            use_cache=True, logits_to_keep=1,
        ).logits[:, -1].float()  # fmt: skip
        run.mask, run.pos = mask, run.pos + 1
        live = run.live
        rows = [row for row in run.rows if row is not None]
        token, logprob = draw(logits[live], self.sampling, [row.request.rng for row in rows])
        run.token[live] = token
        stops = set(self.stop_ids)
        for row, t, lp in zip(rows, token.tolist(), logprob.tolist(), strict=True):
            row.sample.ids.append(t)
            row.sample.logprobs.append(lp)
            row.sample.stopped = t in stops
        self.stats.steps += 1
        self.stats.tokens += len(rows)

    def _leave(self, run: Batch, slot: int) -> Row:
        """Free ``slot``; its row's keys and values (the prompt and the sample but its last token,
        never fed) are kept for the episode's next turn."""
        row = run.free(slot)
        if self.sampling.reuse_rows and run.growing:
            ids = tuple(row.request.prompt + row.sample.ids[:-1])
            self.kept.keep(ids, run.kv(slot), self.sampling.row_cache_tokens)
        return row

    def _cached_parts(self, model: Any, prompts: list[list[int]], device: torch.device) -> list[Part]:
        """Per prompt, its longest cached start (:meth:`KeptKV.parts`). Never for models whose cache
        layers are not plain (sliding windows keep only their last tokens)."""
        if not plain_layers(model_config(self.model)):
            return [None] * len(prompts)
        return self.kept.parts(prompts, self.sampling, lambda prefix: self._prefix_kv(model, prefix, device))

    def _prefix_kv(self, model: Any, prefix: tuple[int, ...], device: torch.device) -> KV:
        """The keys and values of ``prefix`` (one row), prefilled."""
        cache = DynamicCache(config=model_config(model))
        ids = torch.tensor([prefix], device=device)
        model(input_ids=ids, **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1)
        self.stats.prefill_tokens += len(prefix)
        return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]
