"""Callbacks: reward/rollout logging, rehearsal fidelity, transcripts. Checkpointing is Lightning's."""

from envace.callbacks.fidelity import RehearsalFidelity
from envace.callbacks.rollout import RolloutLogger

__all__ = ["RehearsalFidelity", "RolloutLogger"]
