"""State a module keeps or holds around a rollout: the global random generators (saved in
checkpoints, kept across validation) and FSDP2 parameters gathered while generating."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """The global random generators' states (torch CPU, Python, NumPy) as plain data and tensors,
    so a checkpoint holding them still opens with ``torch.load(weights_only=True)``."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    keys = np.asarray(keys)
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


@contextmanager
def kept_rng() -> Iterator[None]:
    """Run the block without moving the global random generators (validation between training steps)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


@contextmanager
def unsharded(model: Any) -> Iterator[None]:
    """Hold FSDP2-sharded parameters gathered while generating.

    Ranks generate different episodes, so they run different numbers of forward passes; with
    sharded parameters every forward is a collective and unequal counts would deadlock. Gathering
    once (``unshard``, no reshard after forward) makes generation local to each rank.
    """
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in sharded:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in sharded:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)
