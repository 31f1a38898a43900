"""Keys and values of a running batch: storage written in place, and how a call's batch is laid out.

New keys and values are written in place into storage allocated ahead (:class:`GrowingLayer`)
instead of being concatenated onto the cache at every step; a row joining a running batch is written
into a free slot of it. :func:`batch_inputs` and :func:`batch_cache` lay out one prefill: each row's
cached part (from :class:`~envace.rollout.engine.kept.KeptKV`) and its new tokens, left-padded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [rows, kv_heads, tokens, head_dim]
LEAD = 128  # spare cache columns left of a batch, for rows joining it with longer contexts
Part = tuple[tuple[int, ...], KV] | None  # a prompt's cached ids and their keys and values [1, ...], if any


class GrowingLayer(DynamicLayer):
    """A KV-cache layer over storage allocated ahead, ``[slots, heads, columns, dim]``: the batch's
    keys and values are the view ``[:rows, :, lo:hi]``.

    ``DynamicLayer`` concatenates at every step, copying the whole cache each time: with a batch of
    8 and 600 cached tokens that copy was a third of a decoding step. Here a step's keys and values
    are written in place at column ``hi``; a row joining a running batch is written into a free slot
    (:meth:`put`), and the view widens to the left (:meth:`widen`) when it is longer than the batch.
    Storage is reallocated (doubled) only when it runs out. Unwritten storage is zero: columns a row
    does not use are masked, and must hold finite numbers (0 × NaN would leak through the mask).

    Args:
        capacity: columns to allocate at the first write.
        lead: of those, spare columns left of the first write (for rows joining later with longer contexts).
    """

    def __init__(self, capacity: int = 0, lead: int = 0) -> None:
        super().__init__()
        self.capacity, self.lead = capacity, lead
        self.store: tuple[torch.Tensor, torch.Tensor] | None = None
        self._view: torch.Tensor | None = None
        self.rows = self.lo = self.hi = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, add = key_states.shape[0], key_states.shape[-2]
        if self.store is None:
            size = max(self.capacity, self.lead + add)
            k_shape, v_shape = key_states.shape, value_states.shape
            self.hold(key_states.new_zeros(rows, k_shape[1], size, k_shape[3]),
                      value_states.new_zeros(rows, v_shape[1], size, v_shape[3]), 0, lo=self.lead)  # fmt: skip
        elif self.keys is not self._view:  # replaced by another method (crop): adopt it
            assert self.keys is not None and self.values is not None
            self.hold(self.keys, self.values, self.keys.shape[-2])
        assert self.store is not None
        if self.hi + add > self.store[0].shape[2]:
            self._resize(self.store[0].shape[0], self.lo, max(add, self.hi - self.lo))
        k, v = self.store
        k[: self.rows, :, self.hi : self.hi + add] = key_states
        v[: self.rows, :, self.hi : self.hi + add] = value_states
        self.hi += add
        return self._set_view()

    def hold(self, keys: torch.Tensor, values: torch.Tensor, n: int, lo: int = 0) -> None:
        """Adopt ``keys``/``values`` (``[rows, heads, columns, dim]``) as storage, columns ``lo:lo + n`` filled."""
        self.lazy_initialization(keys, values)
        self.store, self.rows, self.lo, self.hi = (keys, values), keys.shape[0], lo, lo + n
        self._set_view()

    def put(self, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Row ``slot`` (a free one, or the next one) holds ``keys``/``values`` ``[heads, n, dim]``,
        ending at column ``hi`` (``n`` at most the view's width)."""
        assert self.store is not None and keys.shape[1] <= self.hi - self.lo
        if slot >= self.store[0].shape[0]:
            self._resize(max(slot + 1, 2 * self.store[0].shape[0]), self.lo, self.store[0].shape[2] - self.hi)
        k, v = self.store
        n = keys.shape[1]
        k[slot, :, self.hi - n : self.hi], v[slot, :, self.hi - n : self.hi] = keys, values
        self.rows = max(self.rows, slot + 1)
        self._set_view()

    def widen(self, n: int) -> None:
        """``n`` more columns on the left of the view (zero: masked for every row)."""
        assert self.store is not None
        if self.lo < n:
            self._resize(self.store[0].shape[0], max(n, self.hi - self.lo), self.store[0].shape[2] - self.hi)
        self.lo -= n
        self._set_view()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (repeats allowed), in storage of the same columns; increasing
        indices (dropping rows) move only the rows that shift down, in place."""
        if self.store is None or self.keys is not self._view:
            return super().batch_select_indices(indices)
        k, v = self.store
        order = indices.tolist()
        if all(a < b for a, b in zip(order, order[1:], strict=False)):
            cols = slice(self.lo, self.hi)
            for new, old in enumerate(order):
                if new != old:
                    k[new, :, cols], v[new, :, cols] = k[old, :, cols], v[old, :, cols]
            self.rows = len(order)
            self._set_view()
            return
        keys, values = k.new_zeros(max(len(indices), 1), *k.shape[1:]), v.new_zeros(max(len(indices), 1), *v.shape[1:])
        keys[: len(indices), :, self.lo : self.hi] = k[indices, :, self.lo : self.hi]
        values[: len(indices), :, self.lo : self.hi] = v[indices, :, self.lo : self.hi]
        self.store, self.rows = (keys, values), len(indices)
        self._set_view()

    def _resize(self, slots: int, lead: int, room: int) -> None:
        """New storage: ``slots`` rows, ``lead`` free columns before the view and ``room`` after it."""
        assert self.store is not None
        k, v = self.store
        width = self.hi - self.lo
        keys = k.new_zeros(slots, k.shape[1], lead + width + room, k.shape[3])
        values = v.new_zeros(slots, v.shape[1], lead + width + room, v.shape[3])
        keys[: self.rows, :, lead : lead + width] = k[: self.rows, :, self.lo : self.hi]
        values[: self.rows, :, lead : lead + width] = v[: self.rows, :, self.lo : self.hi]
        self.store, self.lo, self.hi = (keys, values), lead, lead + width

    def _set_view(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.store is not None
        k, v = self.store
        self.keys, self.values = k[: self.rows, :, self.lo : self.hi], v[: self.rows, :, self.lo : self.hi]
        self._view = self.keys
        return self.keys, self.values


@dataclass
class Layout:
    """Where each row's cached part and new part sit in one call's batch.

    Row ``i`` is ``[pad | cached_i | pad | new_i]``: its cached keys end at column ``cached`` and its
    new tokens at column ``cached + width``; positions come from the attention mask.
    """

    cached: int
    width: int
    lengths: list[int]  # cached tokens per row
    news: list[int]  # new (prefilled) tokens per row

    @classmethod
    def of(cls, prompts: list[list[int]], parts: list[Part]) -> Layout:
        """The layout of ``prompts`` whose first ``len(part[0])`` tokens are cached."""
        cached = [len(p[0]) if p else 0 for p in parts]
        news = [len(q) - c for q, c in zip(prompts, cached, strict=True)]
        return cls(cached=max(cached), width=max(news), lengths=cached, news=news)


def plain_layers(config: Any) -> bool:
    """Whether a model of ``config`` has plain :class:`DynamicLayer` cache layers (no sliding window):
    the engine then keeps and joins rows in :class:`GrowingLayer` storage."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


def batch_inputs(prompts: list[list[int]], layout: Layout, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of the batch, ``[rows, cached + width]``."""
    ids = torch.full((len(prompts), layout.cached + layout.width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        c, end = layout.lengths[row], layout.cached + layout.width
        ids[row, layout.cached - c : layout.cached] = torch.tensor(p[:c], dtype=torch.long)
        ids[row, end - layout.news[row] :] = torch.tensor(p[c:], dtype=torch.long)
        mask[row, layout.cached - c : layout.cached] = 1
        mask[row, end - layout.news[row] :] = 1
    return ids, mask


def batch_cache(parts: list[Part], layout: Layout, room: int, config: Any, device: torch.device) -> DynamicCache:
    """A cache holding each row's cached part right-aligned at column ``cached``: of
    :class:`GrowingLayer` when the model's layers are plain, with storage for the prompts and
    ``room`` sampled tokens, and ``LEAD`` spare columns on the left for longer rows joining later."""
    if not plain_layers(config):  # sliding-window or other special layers: no cached parts
        return DynamicCache(config=config)
    size = LEAD + layout.cached + layout.width + room
    cache = DynamicCache(config=config)
    layers = [GrowingLayer(size, LEAD) for _ in cache.layers]
    cache.layers = list(layers)
    some = next((p[1] for p in parts if p is not None), None)
    for i, (k0, v0) in enumerate(some if some is not None and layout.cached else []):
        k = k0.new_zeros(len(parts), k0.shape[1], size, k0.shape[3], device=device)
        v = v0.new_zeros(len(parts), v0.shape[1], size, v0.shape[3], device=device)
        for row, part in enumerate(parts):
            if part is not None:
                cols = slice(LEAD + layout.cached - layout.lengths[row], LEAD + layout.cached)
                k[row, :, cols], v[row, :, cols] = part[1][i][0][0], part[1][i][1][0]
        layers[i].hold(k, v, layout.cached, lo=LEAD)
    return cache
