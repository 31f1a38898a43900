"""Test-time private rehearsal: imagine N attempts of each user turn, condense them into a rehearsal
memory, commit one execution (DESIGN.md §1, §5)."""

from __future__ import annotations

from envace.inference.memory import Attempt, render_attempt, render_memory
from envace.inference.rehearsal import (
    RECORDS,
    RehearsalConfig,
    RehearsingRollout,
    TokenCounts,
    TurnRecord,
    attempt_of,
    fork,
    token_counts,
)

__all__ = [
    "RECORDS",
    "Attempt",
    "RehearsalConfig",
    "RehearsingRollout",
    "TokenCounts",
    "TurnRecord",
    "attempt_of",
    "fork",
    "render_attempt",
    "render_memory",
    "token_counts",
]
