"""What the modules' steps return, typed: the callbacks read these (``RolloutLogger``,
``RehearsalFidelity``). Lightning hands a manual-optimization ``training_step``'s mapping to
``on_train_batch_end`` as it is, so the outputs are ``TypedDict``s."""

from __future__ import annotations

from typing import TypedDict

from torch import Tensor

from envace.rewards import RewardOutput
from envace.rollout.episode import Episode, RolloutStats


class SFTStepOutput(TypedDict):
    """A supervised (warm-start) step: its loss only."""

    loss: Tensor


class RLStepOutput(TypedDict):
    """An RL step: the loss, the episodes rolled out (task-major), their rewards and the rollout's counts."""

    loss: Tensor
    episodes: list[Episode]
    rewards: list[RewardOutput]
    rollout: RolloutStats


class ValStepOutput(TypedDict):
    """A validation step, two families (``val/committed/*`` and ``val/imagined/*``):

    * ``committed``: the policy acting against the real environment, scored by the training proxy
      (``proxy``; the benchmark's official checker scores them in ``RolloutLogger``, as it does the
      training episodes: :func:`envace.callbacks.rollout.official_scores`);
    * ``imagined``: the policy answering its own calls beside a lockstep real environment (its
      fidelity pairs), with the proxy's score of what it imagined (``imagined_proxy``), and
      (``val_gold_fidelity``) the episodes whose gold calls the policy rehearsed (empty without).
    """

    committed: list[Episode]
    proxy: list[RewardOutput]
    imagined: list[Episode]
    imagined_proxy: list[RewardOutput]
    gold_episodes: list[Episode]


TrainStepOutput = SFTStepOutput | RLStepOutput
