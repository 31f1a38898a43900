"""Rehearsal fidelity in validation: rehearsed vs real response for the same call in the same state."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from envace.callbacks.rollout import log_scalars
from envace.metrics.fidelity import FidelityTracker


class RehearsalFidelity(pl.Callback):
    """Feeds the (rehearsed, real) pairs of validation's imagined episodes — run by the module with
    lockstep real environments — into torchmetrics, and logs ``val/imagined/fidelity/*`` (the
    policy's own calls) and ``val/imagined/fidelity_gold/*`` (the gold calls) overall, per benchmark
    and per tool at the end of each validation epoch (the step-0 pass before training included).

    Args:
        per_tool: also log one curve per tool (many curves on large tool sets).
    """

    #: step-output key -> metric prefix: the policy's own calls, and gold calls the policy rehearsed
    SOURCES = {"imagined": "val/imagined/fidelity", "gold_episodes": "val/imagined/fidelity_gold"}

    def __init__(self, per_tool: bool = True):
        self.per_tool = per_tool
        self.trackers: dict[str, FidelityTracker] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.trackers = {k: FidelityTracker(prefix=p).to(pl_module.device) for k, p in self.SOURCES.items()}

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if not isinstance(outputs, dict):
            return
        for key, tracker in self.trackers.items():
            tracker.update([p for ep in outputs.get(key) or [] for p in ep.fidelity])

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for tracker in self.trackers.values():
            values = tracker.compute()
            if not self.per_tool:
                values = {k: v for k, v in values.items() if "/tool/" not in k}
            # an epoch without pairs (no calls were made) has no fidelity: log the count only, not NaN
            scalars = {k: float(v) for k, v in values.items() if not bool(v.isnan())}
            log_scalars(trainer, pl_module, scalars, sync=False)  # compute() is already global
            tracker.reset()
