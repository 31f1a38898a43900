"""The batch being decoded, and the bookkeeping of continuous batching: rows join it, leave it, and
its free slots are dropped. Tensors only, no model: the engine's forwards and draws fill it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from envace.rollout.engine.kv import KV, GrowingLayer
from envace.rollout.engine.sampling import Request, Sample


@dataclass
class Row:
    """A request being generated, and what it has sampled so far."""

    request: Request
    sample: Sample

    @property
    def ended(self) -> bool:
        return self.sample.stopped or len(self.sample.ids) >= self.request.max_new_tokens


@dataclass
class Batch:
    """The batch being decoded. Slot ``s`` of the cache holds ``rows[s]`` (``None``: a free slot, fed
    but never drawn from); its last drawn token ``token[s]``, at position ``pos[s]``, is fed at the
    next step; ``mask[s]`` marks its real columns in the cache."""

    cache: Any
    mask: torch.Tensor
    pos: torch.Tensor
    token: torch.Tensor
    rows: list[Row | None]
    source: list[int] | None = None  # the cache row of each row, while identical prompts share one

    @property
    def live(self) -> list[int]:
        return [s for s, row in enumerate(self.rows) if row is not None]

    @property
    def growing(self) -> bool:
        """Whether rows can join while others decode (the cache's layers are :class:`GrowingLayer`)."""
        return all(isinstance(layer, GrowingLayer) for layer in self.cache.layers)

    def free(self, slot: int) -> Row:
        """Free ``slot``; returns the row it held."""
        row = self.rows[slot]
        assert row is not None
        self.rows[slot] = None
        return row

    def kv(self, slot: int) -> KV:
        """The keys and values of ``slot``'s real columns, ``[1, heads, tokens, dim]`` per layer."""
        cols = self.mask[slot].nonzero().squeeze(1)
        return [
            (layer.keys[slot : slot + 1, :, cols], layer.values[slot : slot + 1, :, cols])
            for layer in self.cache.layers
        ]

    def compact(self) -> None:
        """Drop the free slots: the rows after each one move down in place (:class:`GrowingLayer`);
        with other cache layers, which copy every row, only once a quarter of the slots are free."""
        live = self.live
        if not live or len(live) == len(self.rows):
            return
        if not self.growing and 4 * (len(self.rows) - len(live)) < len(self.rows):
            return
        index = torch.tensor(live, device=self.mask.device)
        for layer in self.cache.layers:
            layer.batch_select_indices(index)
        self.mask, self.pos, self.token = self.mask[index], self.pos[index], self.token[index]
        self.rows = [self.rows[s] for s in live]


def join(run: Batch | None, fresh: Batch) -> Batch:
    """``fresh`` rows written into free slots of ``run`` (new slots when none is free), each
    right-aligned at the batch's last column; the view widens when one is longer than the batch.
    Rows that share a cache row (identical prompts) are copied to their own rows here."""
    if run is None or not run.live:
        if fresh.source is not None:
            index = torch.tensor(fresh.source, device=fresh.mask.device)
            for layer in fresh.cache.layers:
                layer.batch_select_indices(index)
            fresh.source = None
        return fresh
    lengths = fresh.mask.sum(dim=1).tolist()
    wider = int(max(lengths)) - run.mask.shape[1]
    if wider > 0:
        for layer in run.cache.layers:
            layer.widen(wider)
        run.mask = torch.cat([run.mask.new_zeros(len(run.rows), wider), run.mask], dim=1)
    free = [s for s, row in enumerate(run.rows) if row is None]
    for j, row in enumerate(fresh.rows):
        slot = free.pop(0) if free else len(run.rows)
        if slot == len(run.rows):
            run.rows.append(None)
            run.mask = torch.cat([run.mask, run.mask.new_zeros(1, run.mask.shape[1])])
            run.pos, run.token = torch.cat([run.pos, run.pos[:1]]), torch.cat([run.token, run.token[:1]])
        cols, src = fresh.mask[j].nonzero().squeeze(1), fresh.source[j] if fresh.source is not None else j
        for mine, theirs in zip(run.cache.layers, fresh.cache.layers, strict=True):
            mine.put(slot, theirs.keys[src][:, cols], theirs.values[src][:, cols])
        run.mask[slot] = 0
        run.mask[slot, run.mask.shape[1] - len(cols) :] = 1
        run.pos[slot], run.token[slot], run.rows[slot] = fresh.pos[j], fresh.token[j], row
    return run
