"""EnvACE: rollouts inside ``training_step`` (the policy acts and rehearses), then role-wise GRPO."""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from envace.data.batch import StepBatch, TaskPool, TokenBatch, collate_episodes
from envace.losses import LossInputs, RoleGRPOLoss
from envace.modules.base import PolicyModule
from envace.modules.logprobs import chunked_logprobs
from envace.modules.outputs import RLStepOutput, TrainStepOutput
from envace.modules.simulator import SimulatorSpec, build_simulator, copy_policy_into, own_parameters, routed_logprobs
from envace.rewards import RewardOutput
from envace.rollout import (
    Episode,
    ExternalSimulator,
    PolicyRehearsal,
    Rehearsal,
    Responder,
    RolloutResult,
    SamplingEngine,
    make_engine,
    summarize,
)


class EnvACEModule(PolicyModule):
    """World rehearsal trained with role-wise GRPO; the method and its comparison arms by config
    (``configs/arms/``, docs/training.md "The arms"): one training step, the arms differ in who
    writes the tool turns and which weights each role's tokens train.

    * ``responder`` — who answers calls in training rollouts: ``PolicyRehearsal`` (EnvACE: the
      policy, inline, trained as ``rehearse``), ``RealEnvironment`` (environment scaling: context);
    * ``simulator`` — other weights write the tool turns instead (:class:`SimulatorSpec`): frozen
      (the ``simulator`` arm: context, the policy trains on its acts) or trainable (the
      ``separate`` arm: its own weights trained on the ``rehearse`` tokens, the policy's on the act tokens);
    * ``warm_start_only`` — every step a grounded supervised step (the compute-matched ``sft_only`` control);
    * the loss's ``role_weights`` — ablations of the shared policy (``rehearse: 0``: its rehearse
      tokens get no loss, though it still writes them and its act gradient moves the shared weights).

    Args:
        responder: who answers tool calls in training rollouts (default ``PolicyRehearsal``); leave it
            unset with ``simulator``.
        simulator: the weights that write the tool turns of training rollouts, when not the policy's.
        group_size: episodes per task (G); advantages are relative within the group.
        loss: the RL loss.
        warm_start_steps: grounded supervised steps before RL, in the same ``fit`` (docs/design.md §3.9).
        warm_start_only: every step is a warm-start step: no training rollout at all.
        rl_lr_scale: learning-rate multiplier once RL starts (warm start runs at ``optim.lr``).
        kl_reference: the reference of the KL term and of the ``train/rl/kl`` curve: ``warm_start``
            (default; a frozen copy of the policy's adapters as RL begins, sharing its frozen base)
            or ``base`` (the adapters disabled: the base model, which at 135M writes no call at all,
            so a KL to it pulls the policy away from tool use). ``warm_start`` is kept and its KL
            logged even when the loss's ``kl_coef`` is 0: how far RL has moved the policy.
        dynamic_sampling: DAPO's dynamic sampling, at most this many extra rollout rounds per step:
            a group whose rewards are all equal carries no gradient, so it is replaced by the group
            of a training task drawn afresh (seeded by the run's seed and the step) when that group's
            rewards vary. Every sampled episode counts in ``cost/*``; 0 (default) keeps the step's
            groups as they are.
        **kwargs: see :class:`~envace.modules.base.PolicyModule`.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        simulator: SimulatorSpec | None = None,
        group_size: int = 4,
        loss: RoleGRPOLoss | None = None,
        warm_start_steps: int = 0,
        warm_start_only: bool = False,
        rl_lr_scale: float = 1.0,
        kl_reference: Literal["warm_start", "base"] = "warm_start",
        dynamic_sampling: int = 0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if simulator is not None and responder is not None:
            raise ValueError("set model.responder or model.simulator, not both: the simulator answers the calls")
        self.responder = responder or PolicyRehearsal()
        self.simulator_spec = simulator
        self.simulator: Any = None
        self._simulator_engine: SamplingEngine | None = None
        self._simulator_ready = simulator is not None and simulator.from_start
        self.group_size = group_size
        self.loss = loss or RoleGRPOLoss()
        self.warm_start_steps = warm_start_steps
        self.warm_start_only = warm_start_only
        self.rl_lr_scale = rl_lr_scale
        if kl_reference not in ("warm_start", "base"):
            raise ValueError(f"kl_reference must be 'warm_start' or 'base', got {kl_reference!r}")
        self.kl_reference = kl_reference
        if dynamic_sampling < 0:
            raise ValueError(f"dynamic_sampling must be >= 0, got {dynamic_sampling}")
        self.dynamic_sampling = dynamic_sampling
        self.reference: Any = None  # the frozen warm-start copy (configure_model)
        self._reference_ready = False

    def lr_factor(self, step: int) -> float:
        """The warm start's schedule, then RL's own from its first step: its warm-up counts from there
        and its peak is ``optim.lr * rl_lr_scale``, as in a fit that starts RL from the warm start's weights."""
        if self.warm_start_at(step):
            return super().lr_factor(step)
        return super().lr_factor(step - self.rl_start) * self.rl_lr_scale

    @property
    def rl_start(self) -> int:
        """The optimizer step RL begins at in this fit (0 when it has no warm start)."""
        return 0 if self.warm_start_only else self.warm_start_steps

    def warm_start_at(self, step: int) -> bool:
        """Whether optimizer step ``step`` is a grounded warm-start step (else an RL step)."""
        return self.warm_start_only or step < self.warm_start_steps

    def phase_at(self, step: int) -> str:
        return "warm-start" if self.warm_start_at(step) else "rl"

    @property
    def warming_up(self) -> bool:
        return self.warm_start_at(self.global_step)

    # --- the simulator -----------------------------------------------------------------------------
    def configure_model(self) -> None:
        """The policy, then the simulator beside it (a submodule: on the module's device, in checkpoints)."""
        built = self.policy is not None
        super().configure_model()
        if built:
            return
        if self.keeps_reference:
            frozen = SimulatorSpec(source="warm_start", trainable=False)
            self.reference = build_simulator(frozen, self.policy, self.policy_spec, share_base=self.device_mesh is None)
            if self.device_mesh is not None:
                self._shard(self.reference, self.device_mesh)
        spec = self.simulator_spec
        if spec is None:
            return
        self.simulator = build_simulator(spec, self.policy, self.policy_spec, share_base=self.device_mesh is None)
        if self.device_mesh is not None:
            self._shard(self.simulator, self.device_mesh)

    @property
    def keeps_reference(self) -> bool:
        """Whether a frozen warm-start copy is kept: RL with LoRA and ``kl_reference: warm_start``."""
        return self.kl_reference == "warm_start" and self.policy_spec.lora is not None and not self.warm_start_only

    @property
    def simulator_engine(self) -> SamplingEngine:
        if self._simulator_engine is None:
            self._simulator_engine = make_engine(self.simulator, self.tokenizer, self.fmt, self.sampling)
        return self._simulator_engine

    def engines(self) -> list[SamplingEngine]:
        return [self.engine, self.simulator_engine] if self.simulator is not None else [self.engine]

    @property
    def simulator_writes(self) -> bool:
        """Whether the simulator writes the tool turns now (a ``warm_start`` one once RL begins)."""
        return self.simulator is not None and self._simulator_ready

    def training_responder(self) -> Responder:
        """Who answers the calls of training rollouts: the simulator when it writes, else ``responder``."""
        if not self.simulator_writes:
            return self.responder
        assert self.simulator_spec is not None
        if self.simulator_spec.trainable:
            return Rehearsal(self.simulator_engine, trained=True, writer="simulator")
        return ExternalSimulator(self.simulator_engine)

    def rehearsal(self) -> Responder:
        if self.simulator_writes:
            return Rehearsal(self.simulator_engine, trained=False, writer="simulator")
        return super().rehearsal()

    def _logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> Tensor:
        """The policy's log-probs; with a trainable simulator, its own for the ``rehearse`` tokens."""
        if not (self.simulator_writes and self.simulator_spec and self.simulator_spec.trainable):
            return super()._logprobs(batch, temperature)
        policy, simulator = self.policy, self.simulator
        return routed_logprobs(lambda b: self._model_logprobs(policy, b, temperature),
                               lambda b: self._model_logprobs(simulator, b, temperature), batch)  # fmt: skip

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """As RL begins, a ``warm_start`` simulator becomes the policy's warm-started weights."""
        super().on_train_batch_start(batch, batch_idx)
        if self.simulator is not None and not self._simulator_ready and not self.warming_up:
            copy_policy_into(self.policy, self.simulator)
            self._simulator_ready = True
            for engine in self.engines():
                engine.reset_cache()
        if self.reference is not None and not self._reference_ready and not self.warming_up:
            copy_policy_into(self.policy, self.reference)
            self._reference_ready = True

    def saved_weights(self) -> set[str]:
        kept = super().saved_weights()
        if self.simulator is not None:
            kept |= {f"simulator.{n}" for n in own_parameters(self.policy, self.simulator)}
        if self.reference is not None:
            kept |= {f"reference.{n}" for n in own_parameters(self.policy, self.reference)}
        return kept

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["envace"]["simulator_ready"] = self._simulator_ready
        checkpoint["envace"]["reference_ready"] = self._reference_ready

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get("envace") or {}
        self._simulator_ready = bool(saved.get("simulator_ready", self._simulator_ready))
        self._reference_ready = bool(saved.get("reference_ready", False)) and any(
            k.startswith("reference.") for k in checkpoint.get("state_dict", {})
        )

    def training_step(self, batch: StepBatch, batch_idx: int) -> TrainStepOutput:
        if self.warming_up:
            if batch.sft is None:
                raise ValueError(f"warm_start_steps > 0 needs grounded episodes: {self._no_episodes()}")
            return {"loss": self.sft_step(batch.sft, "train")}
        if self.global_step == self.rl_start > 0:
            self.forget_optimizer_state()
        return self.rl_step(batch)

    def forget_optimizer_state(self) -> None:
        """RL starts with a fresh AdamW (no moments, step count 0), as a fit started from the warm start's
        weights does: the warm start's moments would scale RL's first steps by |g_RL| / |g_SFT| and carry
        the supervised direction into them. Runs once, at the first RL step (not again on a resume past it)."""
        opt: Any = self.optimizers()
        getattr(opt, "optimizer", opt).state.clear()

    def rl_step(self, batch: StepBatch) -> RLStepOutput:
        """Roll out G episodes per task, score them, and take the role-wise GRPO loss."""
        result = self.run_episodes(batch.tasks, self.group_size, self.training_responder())
        episodes, rewards = result.episodes, [self.reward(e) for e in result.episodes]
        if self.dynamic_sampling:
            episodes, rewards, result = self.resample_flat_groups(episodes, rewards, result, batch.pool)
        for engine in self.engines():
            engine.reset_cache()  # the rollout's keys and values are dead weight through the update
        tokens = collate_episodes([e.tensors() for e in episodes], self.engine.pad_id).to(self.device)
        inputs = LossInputs(
            logprobs=tokens.logprobs,  # replaced by the policy's, chunk by chunk, in update()
            old_logprobs=tokens.logprobs,
            roles=tokens.roles,
            loss_mask=tokens.loss_mask,
            rewards=torch.tensor([math.nan if r.score is None else r.score for r in rewards], device=self.device),
            group_ids=torch.tensor([e.group for e in episodes], device=self.device),
            ref_logprobs=self.reference_logprobs(tokens)
            if self.loss.kl_coef > 0 or self.reference is not None
            else None,
        )
        still = self.loss.still_rows(inputs)  # flat groups: a forward for the stats, no backward
        loss, stats = self.update(
            tokens, lambda lp: self.loss(inputs._replace(logprobs=lp)), self.loss_temperature, still
        )
        self.log_stats("train/rl", {"loss": loss, **stats}, len(episodes))
        return RLStepOutput(loss=loss, episodes=episodes, rewards=rewards, rollout=result.stats)

    def resample_flat_groups(
        self, episodes: list[Episode], rewards: list[RewardOutput], result: RolloutResult, pool: TaskPool | None
    ) -> tuple[list[Episode], list[RewardOutput], RolloutResult]:
        """Dynamic sampling (``dynamic_sampling`` rounds): each group without reward variance is replaced
        by the group of a task drawn from ``pool`` (the step batch's: RL's training tasks) that has some;
        the result counts every sampled episode. Without a pool (or an empty one) nothing is replaced."""
        g, sampled, seconds, replaced = self.group_size, list(episodes), result.stats.seconds, 0
        draw = pool.draws(self.global_step) if pool is not None and pool.tasks else None
        for _ in range(self.dynamic_sampling):
            flat = flat_groups([r.score for r in rewards], g)
            if not flat or draw is None:
                break
            tasks = draw(len(flat))
            more = self.run_episodes(tasks, g, self.training_responder())
            sampled += more.episodes
            seconds += more.stats.seconds
            fresh = [self.reward(e) for e in more.episodes]
            with_signal = [k for k in range(len(tasks)) if k not in set(flat_groups([r.score for r in fresh], g))]
            for slot, k in zip(flat, with_signal, strict=False):
                episodes[slot * g : (slot + 1) * g] = more.episodes[k * g : (k + 1) * g]
                rewards[slot * g : (slot + 1) * g] = fresh[k * g : (k + 1) * g]
                replaced += 1
        for i, e in enumerate(episodes):
            e.group = i // g  # the groups of the step, in order
        self.log_stats("train/rl/dynamic", {"replaced": float(replaced), "sampled": float(len(sampled))}, len(episodes))
        return (
            episodes,
            rewards,
            RolloutResult(episodes, summarize(sampled, seconds, result.stats.generated_tokens_per_s)),
        )

    @torch.no_grad()
    def reference_logprobs(self, tokens: Any) -> Tensor:
        """Log-probs of the reference policy (``kl_reference``): the frozen warm-start copy, or the
        same model with its LoRA adapters disabled (the base)."""
        if self.policy_spec.lora is None:
            raise ValueError("kl_coef > 0 needs a reference: use LoRA (its frozen base is shared by the reference)")
        t = self.loss_temperature  # the same distribution as the policy's log-probs in the loss
        if self.reference is not None:  # each row chunk's shared prefix run once, as in the update
            ref = self.reference
            return chunked_logprobs(lambda b: self._model_logprobs(ref, b, t), tokens, self._chunk_tokens(),
                                    self._prefix)  # fmt: skip
        with self.policy.disable_adapter():
            return chunked_logprobs(lambda b: self._model_logprobs(self.policy, b, t), tokens,
                                    self._chunk_tokens(), self._prefix)  # fmt: skip


def flat_groups(scores: list[float | None], group_size: int) -> list[int]:
    """Indices of the groups (consecutive ``group_size`` episodes) whose scored rewards are all equal:
    their advantages are 0 and they carry no gradient (unscored episodes are left out).

    >>> flat_groups([1.0, 1.0, 0.0, 1.0, None, 0.0, 0.0, 0.0], 2)
    [0, 2, 3]
    """
    out = []
    for k in range(len(scores) // group_size):
        scored = {s for s in scores[k * group_size : (k + 1) * group_size] if s is not None}
        if len(scored) <= 1:
            out.append(k)
    return out
