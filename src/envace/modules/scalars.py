"""Training scalars written to the loggers once, at the step that made them (docs/metrics.md).

Lightning's ``self.log`` in a training step keeps every key it has seen until the epoch ends and
writes each again at every later step. A fit is one epoch, so the warm start's ``train/sft/*``
would repeat their last value through every RL step, and a benchmark absent from a step would
repeat its last reward. Training scalars therefore go to the loggers directly; the progress bar
still takes its few keys through ``self.log(..., prog_bar=True, logger=False)``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


def step_index(trainer: pl.Trainer) -> int:
    """The x-axis of Lightning's own logging, in training and validation: the batches that stepped
    before the current one (``trainer.global_step`` is one ahead once a manual update has run)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def log_step(module: pl.LightningModule, scalars: dict[str, float], always: bool = False) -> None:
    """Write ``scalars`` to every logger of ``module``'s trainer at the current training step: every
    ``trainer.log_every_n_steps`` steps, as Lightning does, or at every step with ``always`` (totals
    meant to be summed over a run, ``cost/*``). Loggers write on the first process only, as
    Lightning's do; without a trainer (a module stepped by hand) nothing is written."""
    trainer: Any = getattr(module, "_trainer", None)
    if trainer is None or not trainer.loggers or not scalars:
        return
    step = step_index(trainer)
    if not always and (step + 1) % trainer.log_every_n_steps and not trainer.should_stop:
        return
    for logger in trainer.loggers:
        logger.log_metrics(scalars, step=step)
