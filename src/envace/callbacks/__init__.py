"""Callbacks: reward/rollout logging, rehearsal fidelity, transcripts, the progress bar and the TensorBoard
logger (every logged key: docs/metrics.md). Checkpointing is Lightning's."""

from envace.callbacks.board import BoardLogger, FitProgressBar
from envace.callbacks.fidelity import RehearsalFidelity
from envace.callbacks.rollout import RolloutLogger

__all__ = ["BoardLogger", "FitProgressBar", "RehearsalFidelity", "RolloutLogger"]
