"""Grounded warm start of both roles: role-weighted NLL on gold act turns and real tool responses."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from envace.data.batch import StepBatch
from envace.modules.base import PolicyModule


class SFTModule(PolicyModule):
    """Supervised warm start (docs/design.md §3.9) on grounded episodes; validation runs imagined
    episodes with lockstep real environments, so fidelity and success are measured as for RL.

    Args:
        **kwargs: see :class:`~envace.modules.base.PolicyModule`.
    """

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)

    def training_step(self, batch: StepBatch, batch_idx: int) -> Tensor:
        if batch.sft is None:
            raise ValueError(f"SFTModule needs grounded episodes: {self._no_episodes()}")
        return self.sft_step(batch.sft, "train")
