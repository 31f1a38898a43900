"""EnvACE: rollouts inside ``training_step`` (the policy acts and rehearses), then role-wise GRPO."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from envace.data.batch import StepBatch, collate_episodes
from envace.losses import LossInputs, RoleGRPOLoss
from envace.modules.base import PolicyModule
from envace.modules.logprobs import chunked_logprobs, selected_logprobs
from envace.modules.outputs import RLStepOutput, TrainStepOutput
from envace.rollout import PolicyRehearsal, Responder


class EnvACEModule(PolicyModule):
    """World rehearsal trained with role-wise GRPO; the method and its baselines by config.

    The responder decides who answers calls during training: ``PolicyRehearsal`` (EnvACE),
    ``RealEnvironment`` (environment scaling), ``ExternalSimulator`` (simulator baseline). Role
    weights of the loss give the ablations (``rehearse: 0`` trains the caller only, ``act: 0``
    freezes it).

    Args:
        responder: who answers tool calls in training rollouts.
        group_size: episodes per task (G); advantages are relative within the group.
        loss: the RL loss.
        warm_start_steps: grounded supervised steps before RL, in the same ``fit`` (docs/design.md §3.9).
        rl_lr_scale: learning-rate multiplier once RL starts (warm start runs at ``optim.lr``).
        **kwargs: see :class:`~envace.modules.base.PolicyModule`.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        group_size: int = 4,
        loss: RoleGRPOLoss | None = None,
        warm_start_steps: int = 0,
        rl_lr_scale: float = 1.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.responder = responder or PolicyRehearsal()
        self.group_size = group_size
        self.loss = loss or RoleGRPOLoss()
        self.warm_start_steps = warm_start_steps
        self.rl_lr_scale = rl_lr_scale

    def lr_factor(self, step: int) -> float:
        return super().lr_factor(step) * (1.0 if step < self.warm_start_steps else self.rl_lr_scale)

    @property
    def warming_up(self) -> bool:
        return self.global_step < self.warm_start_steps

    def training_step(self, batch: StepBatch, batch_idx: int) -> TrainStepOutput:
        if self.warming_up:
            if batch.sft is None:
                raise ValueError("warm_start_steps > 0 needs grounded episodes: set data.warm_start: true")
            return {"loss": self.sft_step(batch.sft, "train")}
        return self.rl_step(batch)

    def rl_step(self, batch: StepBatch) -> RLStepOutput:
        """Roll out G episodes per task, score them, and take the role-wise GRPO loss."""
        result = self.run_episodes(batch.tasks, self.group_size, self.responder)
        episodes = result.episodes
        self.engine.reset_cache()  # the rollout's keys and values are dead weight through the update
        rewards = [self.reward(e) for e in episodes]
        tokens = collate_episodes([e.tensors() for e in episodes], self.engine.pad_id).to(self.device)
        inputs = LossInputs(
            logprobs=tokens.logprobs,  # replaced by the policy's, chunk by chunk, in update()
            old_logprobs=tokens.logprobs,
            roles=tokens.roles,
            loss_mask=tokens.loss_mask,
            rewards=torch.tensor([math.nan if r.score is None else r.score for r in rewards], device=self.device),
            group_ids=torch.tensor([e.group for e in episodes], device=self.device),
            ref_logprobs=self.reference_logprobs(tokens) if self.loss.kl_coef > 0 else None,
        )
        loss, stats = self.update(tokens, lambda lp: self.loss(inputs._replace(logprobs=lp)), self.loss_temperature)
        self.log_stats("train/rl", {"loss": loss, **stats}, len(episodes))
        return RLStepOutput(loss=loss, episodes=episodes, rewards=rewards, rollout=result.stats)

    @torch.no_grad()
    def reference_logprobs(self, tokens: Any) -> Tensor:
        """Log-probs of the reference policy: the same model with LoRA adapters disabled."""
        if self.policy_spec.lora is None:
            raise ValueError("kl_coef > 0 needs a reference: use LoRA (the base model is the reference)")
        with self.policy.disable_adapter():
            t = self.loss_temperature  # the same distribution as the policy's log-probs in the loss
            return chunked_logprobs(lambda b: selected_logprobs(self.policy, b, temperature=t), tokens,
                                    self._chunk_tokens())  # fmt: skip
