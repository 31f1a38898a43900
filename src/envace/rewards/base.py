"""What every reward function returns. Rewards are plain functions ``(task, trajectory) -> RewardOutput``
that need no environment (docs/design.md §3.5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RewardOutput:
    """A trajectory's score.

    Attributes:
        score: in [0, 1]; ``None`` when it could not be computed (judge failure, or a reward that
            raised :class:`RewardUnavailable`): the episode is then masked out of the loss, not scored 0.
        success: the strict task-success flag (all turns / all checks passed).
        details: per-check information for logging and debugging.
    """

    score: float | None
    success: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def masked(self) -> bool:
        return self.score is None


class RewardUnavailable(Exception):
    """Raised by a reward function that cannot compute this episode's reward for a reason outside
    the code (a remote judge unreachable, past its deadline, or answering nonsense): the episode is
    masked (``score=None``) and counted in ``train/reward/masked``, never scored 0. Any other exception is
    a bug and stops the run (:func:`envace.rewards.compute_reward`)."""


class RewardError(RuntimeError):
    """A reward function raised: a bug, not an episode that cannot be scored. The message names the
    reward and the task; the original exception is the cause."""
