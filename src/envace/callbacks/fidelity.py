"""Rehearsal fidelity in validation: rehearsed vs real response for the same call in the same state."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from envace.metrics.fidelity import FidelityTracker


class RehearsalFidelity(pl.Callback):
    """Feeds the (rehearsed, real) pairs of validation episodes — run by the module with lockstep
    real environments — into torchmetrics, and logs ``fidelity/*`` overall, per benchmark and per
    tool at the end of each validation epoch.

    Args:
        per_tool: also log one curve per tool (many curves on large tool sets).
    """

    def __init__(self, per_tool: bool = True):
        self.per_tool = per_tool
        self.tracker: FidelityTracker | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.tracker = FidelityTracker().to(pl_module.device)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if self.tracker is not None and isinstance(outputs, dict) and "episodes" in outputs:
            self.tracker.update([p for ep in outputs["episodes"] for p in ep.fidelity])

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.tracker is None:
            return
        values = self.tracker.compute()
        if not self.per_tool:
            values = {k: v for k, v in values.items() if "/tool/" not in k}
        # an epoch without pairs (no calls were made) has no fidelity: log the count only, not NaN
        pl_module.log_dict({k: float(v) for k, v in values.items() if not bool(v.isnan())}, sync_dist=False)
        self.tracker.reset()
