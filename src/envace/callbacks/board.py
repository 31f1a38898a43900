"""How a fit reads while it runs and in TensorBoard: the progress bar, the logger, and the custom-scalars
layout that opens on the headline curves (every key is in docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import TensorBoardLogger

_SCORES = "(json_valid|exact_match|key_f1|value_f1|error_agreement|decision_f1)$"

#: TensorBoard's custom-scalars layout (``{category: {chart: ["Multiline", [tag regex, ...]]}}``; a
#: regex matches a tag from its start): the first category holds the curves a run is judged by.
LAYOUT: dict[str, dict[str, list[Any]]] = {
    "headline": {
        "committed success (official checker, real environment)": ["Multiline", [r"val/committed/official_success/"]],
        "gold-call rehearsal fidelity": ["Multiline", [rf"val/imagined/fidelity_gold/{_SCORES}"]],
        "own-call rehearsal fidelity": ["Multiline", [rf"val/imagined/fidelity/{_SCORES}"]],
        "training loss (warm start, then RL)": ["Multiline", [r"train/(sft|rl)/loss$"]],
        "RL reward and success": ["Multiline", [r"train/(reward|success)/all$"]],
    },
    "validation": {
        "committed: official vs proxy": ["Multiline", [r"val/committed/(official_score|proxy_score|proxy_gap)/all$"]],
        "committed: turn score, act tool F1": ["Multiline", [r"val/committed/(turn_score|act_tool_f1)/all$"]],
        "imagined: proxy (biased)": ["Multiline", [r"val/imagined/proxy_(score|success)/all$"]],
        "fidelity pairs": ["Multiline", [r"val/imagined/fidelity(_gold)?/pairs$"]],
    },
    "training": {
        "warm start: NLL per role": ["Multiline", [r"train/sft/nll/"]],
        "RL: clipping, ratio, KL": ["Multiline", [r"train/rl/(clip_frac|ratio_mean|kl)$"]],
        "RL: groups": ["Multiline", [r"train/rl/(adv/zero_group_frac|reward/group_std|reward/valid_frac)$"]],
        "rollout: tokens per episode": ["Multiline", [r"train/rollout/(act|rehearse|context)_tokens$"]],
        "rollout: error and truncation rates": ["Multiline", [r"train/rollout/(format_error|truncation)_rate$"]],
    },
    "cost": {"tokens generated, environment calls (per step)": ["Multiline", [r"cost/"]]},
}


def write_layout(trainer: pl.Trainer) -> None:
    """Write :data:`LAYOUT` to every TensorBoard logger of ``trainer`` (TensorBoard's Custom Scalars tab)."""
    for logger in trainer.loggers:
        experiment: Any = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_custom_scalars"):
            experiment.add_custom_scalars(LAYOUT)


class BoardLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger without the ``epoch`` scalar Lightning adds to every write (a fit
    is one epoch: a flat line at 0). Set ``default_hp_metric: false`` beside it (the configs do), or
    TensorBoard also shows Lightning's placeholder ``hp_metric`` of −1."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        kept = {k: v for k, v in metrics.items() if k != "epoch"}
        if kept:
            super().log_metrics(kept, step)


class FitProgressBar(TQDMProgressBar):
    """Lightning's progress bar showing what the fit does: the phase of the step just taken
    (``warm-start`` or ``rl``: the module's ``phase_at``), its ``loss`` and, in RL, the mean
    ``reward`` of its episodes (``train/reward/all``), instead of the logger's version number."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = dict(super().get_metrics(trainer, pl_module))
        items.pop("v_num", None)
        phase_at = getattr(pl_module, "phase_at", None)
        if phase_at is None:
            return items
        phase = phase_at(max(trainer.global_step - 1, 0))
        if phase != "rl":
            items.pop("reward", None)
        return {"phase": phase, **items}
