"""Per-token log-probs where the loss needs them, and an update whose memory does not grow with the
batch: the pure tensor side of the modules (no trainer, no logging).

* :func:`selected_logprobs` — the LM head runs only at the positions the loss reads;
* :func:`prefix_shared_logprobs` — a context prefix the rows share (a group's system turn and
  tools) runs once;
* :func:`row_chunks`, :func:`chunked_logprobs`, :func:`backward_in_chunks` — a batch in row chunks
  within a token budget (:func:`chunk_budget`), forward and backward chunk by chunk, the gradients
  adding up to the whole batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from envace.data.batch import TokenBatch
from envace.losses import gather_logprobs
from envace.policy import cache_kwarg, model_config


def selected_logprobs(model: Any, batch: TokenBatch, chunk_size: int = 512, temperature: float = 1.0) -> Tensor:
    """``[B, T]`` log-probs of each token given its prefix, computed only at loss positions.

    Position ``t`` holds ``log p(input_ids[t] | input_ids[:t])`` (at ``temperature``: the softmax of
    the logits divided by it, as the sampler drew) where ``loss_mask[:, t]`` is set in any row, else
    0. The LM head and log-softmax run only on those positions (``logits_to_keep`` with an index
    tensor): the long tool block and user turns never reach the vocabulary projection.
    """
    mask = batch.loss_mask.bool()
    mask[:, 0] = False  # the first token has no prefix
    positions = mask.any(dim=0).nonzero().squeeze(-1)  # token positions whose log-prob is needed
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    if positions.numel() == 0:
        return out + 0.0 * next(p for p in model.parameters() if p.requires_grad).sum()
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=positions - 1, use_cache=False
    ).logits  # logits at t-1 predict token t
    lp = gather_logprobs(logits, batch.input_ids[:, positions], chunk_size, temperature)
    return out.index_copy(1, positions, lp)


def shared_prefix_length(batch: TokenBatch, minimum: int = 64) -> int:
    """Length of the context prefix every row shares (0 when shorter than ``minimum``).

    It stops before the first position whose log-prob the loss needs, so that position's logits
    still come from the per-row part.
    """
    ids, mask = batch.input_ids, batch.loss_mask.bool()
    same = (ids == ids[:1]).all(dim=0) & batch.attention_mask.bool().all(dim=0)
    differs = (~same).nonzero()
    n = int(differs[0]) if len(differs) else ids.shape[1]
    needed = mask.any(dim=0).nonzero()
    if len(needed):
        n = min(n, int(needed[0]) - 1)
    return n if n >= minimum and ids.shape[0] > 1 else 0


def prefix_shared_logprobs(
    model: Any, batch: TokenBatch, prefix: int, chunk_size: int = 512, temperature: float = 1.0
) -> Tensor:
    """:func:`selected_logprobs` with the shared prefix run once instead of once per row.

    A group's episodes share the system turn with its tool block; its keys and values are computed
    for one row and expanded to the batch (autograd sums the gradient of every row back into them),
    then each row's own part attends to them. Same values and gradients, ``(B - 1) * prefix`` fewer
    tokens through the network.
    """
    batch_size = batch.input_ids.shape[0]
    cache = DynamicCache(config=model_config(model))
    model(input_ids=batch.input_ids[:1, :prefix], **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1)
    shared = DynamicCache(
        ddp_cache_data=[
            (layer.keys.expand(batch_size, -1, -1, -1), layer.values.expand(batch_size, -1, -1, -1))  # type: ignore[union-attr]
            for layer in cache.layers
        ],
        config=model_config(model),
    )
    rest = TokenBatch(*(t[:, prefix:] for t in batch))
    mask = batch.loss_mask.bool()[:, prefix:]
    positions = mask.any(dim=0).nonzero().squeeze(-1)  # needed positions within the per-row part
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    if positions.numel() == 0:
        return out
    logits = model(
        input_ids=rest.input_ids,
        attention_mask=batch.attention_mask,  # prefix + rows: the mask covers the cached positions too
        **cache_kwarg(model, shared),
        use_cache=True,
        logits_to_keep=positions - 1,
    ).logits
    lp = gather_logprobs(logits, rest.input_ids[:, positions], chunk_size, temperature)
    return out.index_copy(1, positions + prefix, lp)


def row_chunks(batch: TokenBatch, max_tokens: int, prefix_of: Callable[[TokenBatch], int] | None = None) -> list[slice]:
    """Consecutive row ranges whose forward runs at most ``max_tokens`` tokens: rows × their longest
    row, less what ``prefix_of`` (the shared prefix a forward runs once, e.g. a group's system turn)
    saves. A row longer than that is a chunk of its own.

    >>> mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4] * 2)  # rows of 6, 2, 6, 2 tokens
    >>> b = TokenBatch(*(torch.ones(4, 6),) * 5)._replace(attention_mask=mask)
    >>> [(c.start, c.stop) for c in row_chunks(b, 12)], [(c.start, c.stop) for c in row_chunks(b, 5)]
    ([(0, 2), (2, 4)], [(0, 1), (1, 2), (2, 3), (3, 4)])
    """
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]

    def cost(rows: slice) -> int:
        n, longest = rows.stop - rows.start, max(lengths[rows])
        prefix = prefix_of(TokenBatch(*(t[rows, :longest] for t in batch))) if prefix_of and n > 1 else 0
        return prefix + n * (longest - prefix)

    chunks, start = [], 0
    for row in range(1, len(lengths)):
        if cost(slice(start, row + 1)) > max_tokens:
            chunks.append(slice(start, row))
            start = row
    chunks.append(slice(start, len(lengths)))
    return chunks


def chunked_logprobs(
    fn: Callable[[TokenBatch], Tensor],
    batch: TokenBatch,
    max_tokens: int | None,
    prefix_of: Callable[[TokenBatch], int] | None = None,
) -> Tensor:
    """``fn(batch)`` (``[B, T]`` log-probs) over row chunks of at most ``max_tokens`` padded tokens, for
    values without gradients (validation, the KL reference): one chunk's activations at a time. A
    batch that fits, or ``max_tokens=None``, runs ``fn`` on it directly."""
    chunks = row_chunks(batch, max_tokens, prefix_of) if max_tokens else []
    if len(chunks) <= 1:
        return fn(batch)
    return torch.cat([_chunk_logprobs(fn, batch, rows) for rows in chunks])


def _chunk_logprobs(fn: Callable[[TokenBatch], Tensor], batch: TokenBatch, rows: slice) -> Tensor:
    """``fn`` on ``batch``'s rows ``rows``, trimmed to their longest row (right padding), padded back to ``T``."""
    width = int(batch.attention_mask[rows].sum(dim=1).max())
    lp = fn(TokenBatch(*(t[rows, :width] for t in batch)))
    return torch.nn.functional.pad(lp, (0, batch.input_ids.shape[1] - width))


def chunk_budget(tokens_at_16_bit: int, activations: torch.dtype) -> int:
    """Tokens per loss chunk for ``activations`` of that dtype, at the memory ``tokens_at_16_bit``
    16-bit tokens take (activations scale with the element size).

    >>> chunk_budget(2048, torch.bfloat16), chunk_budget(2048, torch.float32)
    (2048, 1024)
    """
    return max(1, tokens_at_16_bit * 2 // torch.empty(0, dtype=activations).element_size())


LossOf = Callable[[Tensor], tuple[Tensor, dict[str, Tensor]]]


def backward_in_chunks(
    fn: Callable[[TokenBatch], Tensor],
    batch: TokenBatch,
    loss_of: LossOf,
    max_tokens: int | None,
    backward: Callable[[Tensor], Any] = Tensor.backward,
    prefix_of: Callable[[TokenBatch], int] | None = None,
    still: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Accumulate the gradient of ``loss_of(fn(batch))`` one row chunk at a time; returns the detached
    loss and stats of the whole batch.

    Each chunk of at most ``max_tokens`` padded tokens (:func:`row_chunks`) is run forward, and the
    loss is taken with the chunk's log-probs in their rows and constants elsewhere, then backward at
    once (rows not run yet hold ``batch.logprobs``, the sampling log-probs, as constants): the
    activations alive at a time are one chunk's, whatever the number or length of the episodes,
    and nothing is recomputed. Exact for every loss in which a row's gradient does not
    depend on the other rows' log-probs (token or sequence means with normalisers from the masks,
    advantages from the rewards: both EnvACE losses); ``tests/modules/test_logprobs.py`` checks the
    gradients against one backward over the whole batch.

    ``still``: ``[B]`` bool, rows whose gradient is known to be exactly zero (GRPO: a group without
    reward variance and no KL term, :meth:`~envace.losses.RoleGRPOLoss.still_rows`). They run forward
    without autograd, for the loss's value and stats, and take no backward: their share of the step's
    cost falls from a forward and a backward to a forward. A batch whose every row is still runs as
    without ``still`` (the step then carries an all-zero gradient, which Adam's moments still see).
    """
    if still is not None and (still.all() or not still.any()):
        still = None
    chunks = _chunks(batch, max_tokens, prefix_of, still)
    if len(chunks) <= 1 and still is None:
        loss, stats = loss_of(fn(batch))
        backward(loss)
        return loss.detach(), stats
    values = batch.logprobs.detach().float().clone()  # rows not yet run: the sampling log-probs (ratio 1)
    for rows in chunks:
        if still is not None and bool(still[rows.start]):
            with torch.no_grad():
                values[rows] = _chunk_logprobs(fn, batch, rows).float()
            continue
        lp = _chunk_logprobs(fn, batch, rows)
        placed = torch.cat([values[: rows.start], lp, values[rows.stop :]])
        part, _ = loss_of(placed)
        backward(part)
        values[rows] = lp.detach()
    with torch.no_grad():
        loss, stats = loss_of(values)
    return loss, stats


def _chunks(
    batch: TokenBatch, max_tokens: int | None, prefix_of: Callable[[TokenBatch], int] | None, still: Tensor | None
) -> list[slice]:
    """:func:`row_chunks` (or the whole batch, without ``max_tokens``) within each run of consecutive
    rows that are all still or all not, so that no chunk mixes the two."""
    rows = batch.input_ids.shape[0]
    flags = [False] * rows if still is None else [bool(x) for x in still]
    runs, start = [], 0
    for row in range(1, rows + 1):
        if row == rows or flags[row] != flags[start]:
            runs.append(slice(start, row))
            start = row
    out = []
    for run in runs:
        part = TokenBatch(*(t[run] for t in batch))
        inner = row_chunks(part, max_tokens, prefix_of) if max_tokens else [slice(0, run.stop - run.start)]
        out += [slice(run.start + c.start, run.start + c.stop) for c in inner]
    return out
