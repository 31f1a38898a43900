"""Test-time imagination (the paper's private rehearsal): imagine N attempts of each user turn,
condense them into a memory, commit one execution (docs/design.md §1, §5)."""

from __future__ import annotations

from envace.inference.imagine import (
    Imagination,
    ImaginationConfig,
    TokenCounts,
    attempt_of,
    fork,
    imagining_rollout,
    token_counts,
)
from envace.protocol.memory import Attempt, ImaginedTurn, render_attempt, render_memory

__all__ = [
    "Attempt",
    "Imagination",
    "ImaginationConfig",
    "ImaginedTurn",
    "TokenCounts",
    "attempt_of",
    "fork",
    "imagining_rollout",
    "render_attempt",
    "render_memory",
    "token_counts",
]
