"""Would a shared-prefix ("cascade") attention pay for the rollout's decoding steps? A measurement.

::

    .venv/bin/python studies/performance/shared_prefix_attention.py

The engine's batch holds each row's copy of the group's shared system turn, so a single-token step
reads those keys and values once per row. A cascade attention reads them once for all rows (the
rows' grouped queries against one copy, one product per key head) and merges with each row's own
part by log-sum-exp. This times both over 30 layers of SmolLM2-135M's attention shapes (3 key heads
of 64, 3 query heads each, fp32), ``--cached`` keys per row of which ``--shared`` are the prefix,
checks that they agree, and prints one JSON object (``docs/performance.md``, "Not reached").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import jsonargparse
import torch
import torch.nn.functional as F

FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
LAYERS, KV_HEADS, GROUP, DIM = 30, 3, 3, 64


def cascade(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, shared: int) -> torch.Tensor:
    """Attention of ``q [rows, kv_heads, group, dim]`` (one token per row, query heads grouped by key
    head) over ``k``/``v [rows, kv_heads, keys, dim]`` whose first ``shared`` keys are the same in
    every row; ``mask [rows, 1, 1, keys]`` (True: attend)."""
    rows, scale = q.shape[0], DIM**-0.5
    prefix, lse_p = FLASH(q.transpose(0, 1).reshape(1, KV_HEADS, rows * GROUP, DIM), k[:1, :, :shared],
                          v[:1, :, :shared], scale=scale)  # fmt: skip
    own_mask = torch.zeros(mask[..., shared:].shape).masked_fill(~mask[..., shared:], float("-inf"))
    own, lse_o = FLASH(q, k[:, :, shared:], v[:, :, shared:], attn_mask=own_mask, scale=scale)
    prefix = prefix.reshape(KV_HEADS, rows, GROUP, DIM).transpose(0, 1)
    lse_p = lse_p.reshape(KV_HEADS, rows, GROUP).transpose(0, 1)
    lse = torch.logaddexp(lse_p, lse_o)
    return prefix * (lse_p - lse).exp()[..., None] + own * (lse_o - lse).exp()[..., None]


def timed_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    began = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - began) / reps * 1e3


def measure(rows: int, cached: int, shared: int, reps: int) -> dict[str, float | int]:
    """Milliseconds of one decoding step's attention (30 layers), plain SDPA vs cascade, ``rows`` wide."""
    layers = []
    for _ in range(LAYERS):  # distinct tensors per layer, as in the model's cache: nothing stays in cache
        k, v = torch.randn(rows, KV_HEADS, cached, DIM), torch.randn(rows, KV_HEADS, cached, DIM)
        k[:, :, :shared], v[:, :, :shared] = k[:1, :, :shared], v[:1, :, :shared]
        layers.append((k, v))
    q = torch.randn(rows, KV_HEADS, GROUP, DIM)
    mask = torch.ones(rows, 1, 1, cached, dtype=torch.bool)
    mask[1:, :, :, shared : shared + 20] = False  # left padding after the prefix, as the engine's rows have
    k, v = layers[0]
    diff = (F.scaled_dot_product_attention(q, k, v, attn_mask=mask) - cascade(q, k, v, mask, shared)).abs().max()
    plain = timed_ms(lambda: [F.scaled_dot_product_attention(q, k, v, attn_mask=mask) for k, v in layers], reps)
    both = timed_ms(lambda: [cascade(q, k, v, mask, shared) for k, v in layers], reps)
    return {"rows": rows, "sdpa_ms": round(plain, 2), "cascade_ms": round(both, 2), "max_abs_diff": float(diff)}


def main(rows: list[int] = [2, 3, 8], cached: int = 800, shared: int = 710, reps: int = 10) -> None:  # noqa: B006
    """Args:
    rows: batch widths.
    cached: keys per row (the bench task's later calls hold ~800).
    shared: of which the group's shared prefix (the bench task's system turn: 710).
    reps: timed repetitions of the 30 layers.
    """
    torch.set_num_threads(2)
    torch.manual_seed(0)
    steps = [measure(n, cached, shared, reps) for n in rows]
    print(json.dumps({"cached": cached, "shared": shared, "layers": LAYERS, "per_step": steps}, indent=1))


if __name__ == "__main__":
    jsonargparse.CLI(main)
