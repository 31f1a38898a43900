"""The machine's matmul peak: the reference of every utilisation figure."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch


def matmul_gflops(dtype: torch.dtype, n: int, reps: int = 5, device: str | torch.device = "cpu") -> float:
    """GFLOP/s of the fastest of ``reps`` ``[n, n] @ [n, n]`` products in ``dtype`` on ``device`` (each
    timed to its end: on a GPU the launch returns before the product is done)."""
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    sync = synchronizer(a.device)
    a @ b  # first call: allocation, kernel selection
    sync()
    best = float("inf")
    for _ in range(reps):
        began = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - began)
    return 2 * n**3 / best / 1e9


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for ``device``'s queued work to finish (``torch.cuda.synchronize``; nothing on CPU)."""
    if device.type == "cuda":
        return partial(torch.cuda.synchronize, device)
    return lambda: None


def measure_peak(sizes: tuple[int, ...] = (512, 1024, 2048), reps: int = 5, bf16: bool = True) -> dict[str, Any]:
    """Best fp32 and bf16 matmul rate over ``sizes`` (at the current thread count).

    ``bf16=False`` (a CPU without native bf16, where a bf16 matmul runs ~100x slower): bf16 is
    measured once, at the smallest size only, to record how slow it is; ``bf16_native`` says which.
    """
    by_size: dict[int, dict[str, float]] = {n: {"fp32": matmul_gflops(torch.float32, n, reps)} for n in sizes}
    for n in sizes if bf16 else sizes[:1]:
        by_size[n]["bf16"] = matmul_gflops(torch.bfloat16, n, reps if bf16 else 1)
    return {
        "fp32_gflops": max(v["fp32"] for v in by_size.values()),
        "bf16_gflops": max(v["bf16"] for v in by_size.values() if "bf16" in v),
        "bf16_native": bf16,
        "by_size": {str(n): {k: round(x, 1) for k, x in v.items()} for n, v in by_size.items()},
        "threads": torch.get_num_threads(),
    }


def merge_peaks(*peaks: dict[str, Any]) -> dict[str, Any]:
    """The best of several peak measurements (taken before and after the heavy sections)."""
    best = dict(max(peaks, key=lambda p: p["fp32_gflops"]))
    best["fp32_gflops"] = max(p["fp32_gflops"] for p in peaks)
    best["bf16_gflops"] = max(p["bf16_gflops"] for p in peaks)
    best["measurements"] = [{"fp32": round(p["fp32_gflops"], 1), "bf16": round(p["bf16_gflops"], 1)} for p in peaks]
    return best
