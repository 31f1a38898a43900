"""What every EnvACE LightningModule shares: the policy built in ``configure_model`` (FSDP2-ready),
the optimizer, the update (log-probs where the loss needs them, :mod:`envace.modules.logprobs`),
rollouts and rewards, and checkpoints that resume exactly."""

from __future__ import annotations

import dataclasses
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor

from envace.data.batch import StepBatch, TokenBatch
from envace.losses import RoleNLLLoss
from envace.modules.logprobs import (
    LossOf,
    backward_in_chunks,
    chunk_budget,
    chunked_logprobs,
    prefix_shared_logprobs,
    selected_logprobs,
    shared_prefix_length,
)
from envace.modules.outputs import ValStepOutput
from envace.modules.scalars import log_step
from envace.modules.state import kept_rng, rng_state, set_rng_state, unsharded
from envace.policy import PolicySpec, load_model, load_tokenizer
from envace.protocol.render import ChatFormat, make_format
from envace.rewards import JudgeSettings, RewardError, RewardOutput, compute_reward
from envace.rollout import (
    Episode,
    Job,
    PolicyRehearsal,
    RealEnvironment,
    Responder,
    Rollout,
    RolloutLimits,
    RolloutResult,
    SamplingConfig,
    SamplingEngine,
    make_engine,
    make_rollout,
    run_together,
)
from envace.rollout.reference import gold_rollout
from envace.types import Task

# The modules step by hand (PolicyModule.update); Lightning then warns, in 12 lines, that a
# ModelCheckpoint holds the weights *after* the step. That is the state a resumed run must start
# from (tests/modules/test_fit.py resumes to bit-equal weights), so the warning says nothing here.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")


@dataclass
class OptimConfig:
    """AdamW and a constant schedule with warm-up.

    Args:
        lr: peak learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_steps: linear warm-up from 0 to ``lr``.
        max_grad_norm: clip the gradient's global norm to this before each step (``None``: no
            clipping). The modules step by hand (:meth:`PolicyModule.update`), so Lightning's own
            ``trainer.gradient_clip_val`` does not apply: set this instead.
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    max_grad_norm: float | None = None


class PolicyModule(pl.LightningModule):
    """Base of :class:`~envace.modules.SFTModule` and :class:`~envace.modules.EnvACEModule`.

    Args:
        policy: the model to train (packaged SmolLM2, a hub id or folder, or ``tiny``), dtype, LoRA.
        optim: optimizer settings.
        chat_format: ``auto`` (the tokenizer's template when it renders tools, else Hermes),
            ``template`` or ``hermes``.
        tool_style: how the Hermes format lists tools: ``json`` (full schemas) or ``compact``.
        limits: episode limits of every rollout (training and validation).
        sampling: how the policy samples.
        val_group_size: episodes per validation task.
        val_temperature: sampling temperature of validation episodes; ``0`` (default) decodes
            greedily, so validation figures move with the weights, not with sampling noise; ``None``
            keeps the training temperature.
        val_gold_fidelity: in validation, also measure fidelity on the gold calls (the oracle acts,
            the policy rehearses), which does not depend on what the policy chooses to call.
        share_prefix: in the loss forward, run the context prefix the batch's episodes share (a group's
            system turn and tools) once instead of once per episode (not under FSDP, where the number
            of forward passes must not depend on a rank's data).
        sft_loss: the warm-start loss (role weights: ``act`` and ``rehearse``).
        loss_chunk_tokens: most padded tokens (rows × length, a shared prefix counted once) in one
            loss forward with 16-bit activations (bf16 autocast or weights); 32-bit activations take
            half as many, for the same memory (:func:`chunk_budget`). A larger batch (a warm-start
            batch, an RL step's episodes) runs forward and backward in row chunks whose gradients add
            up (:func:`backward_in_chunks`), so memory does not grow with the number or length of
            episodes: ``studies/performance/update_memory.py`` measures it. ``None``: one forward over the whole
            batch. Not under FSDP.
        judge: where the ``judge`` reward's remote model is and how long it may take
            (:class:`~envace.rewards.judge.JudgeSettings`); ``None``: the ``ENVACE_JUDGE_*``
            environment variables.
        fsdp_layer_names: module class names sharded one by one under FSDP2 (decoder layers).
    """

    def __init__(
        self,
        policy: PolicySpec | None = None,
        optim: OptimConfig | None = None,
        chat_format: str = "auto",
        tool_style: str = "json",
        limits: RolloutLimits | None = None,
        sampling: SamplingConfig | None = None,
        val_group_size: int = 1,
        val_temperature: float | None = 0.0,
        val_gold_fidelity: bool = True,
        share_prefix: bool = True,
        sft_loss: RoleNLLLoss | None = None,
        loss_chunk_tokens: int | None = 2048,
        judge: JudgeSettings | None = None,
        fsdp_layer_names: tuple[str, ...] = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"),
    ):
        super().__init__()
        self.policy_spec = policy or PolicySpec()
        self.optim = optim or OptimConfig()
        self.limits = limits or RolloutLimits()
        self.sampling = sampling or SamplingConfig()
        self.val_group_size = val_group_size
        self.val_temperature = val_temperature
        self.share_prefix = share_prefix
        self.val_gold_fidelity = val_gold_fidelity
        self.sft_loss = sft_loss or RoleNLLLoss()
        self.loss_chunk_tokens = loss_chunk_tokens
        self.judge = judge
        self._engine: SamplingEngine | None = None
        self.fsdp_layer_names = tuple(fsdp_layer_names)
        self.tokenizer = load_tokenizer(self.policy_spec.name_or_path)
        self.fmt: ChatFormat = make_format(self.tokenizer, chat_format, tool_style)  # type: ignore[arg-type]
        self.policy: Any = None
        self.strict_loading = False  # LoRA checkpoints hold the trainable weights only
        self.automatic_optimization = False  # :meth:`update` steps: backward runs chunk by chunk

    # --- model -----------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Build the HF model here (not in ``__init__``) so FSDP can shard it as it is created."""
        if self.policy is not None:
            return
        self.policy = load_model(self.policy_spec).train()
        if self.device_mesh is not None:
            self._shard(self.policy, self.device_mesh)

    def _shard(self, model: Any, mesh: Any) -> None:
        """FSDP2: ``fully_shard`` each decoder layer, then the whole model (docs/design.md §3.8)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dp_mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        mp = MixedPrecisionPolicy(param_dtype=model.dtype, reduce_dtype=torch.float32)
        for module in model.modules():
            if type(module).__name__ in self.fsdp_layer_names:
                fully_shard(module, mesh=dp_mesh, mp_policy=mp)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp)

    def configure_optimizers(self) -> Any:
        model: Any = self.trainer.model
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.optim.lr, weight_decay=self.optim.weight_decay, betas=self.optim.betas)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def lr_factor(self, step: int) -> float:
        """Multiplier of the peak learning rate at optimizer step ``step``."""
        warm = self.optim.warmup_steps
        return min(1.0, (step + 1) / warm) if warm else 1.0

    def token_logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> Tensor:
        """Per-token log-probs of the current policy at loss positions (at ``temperature``), each row
        chunk's shared prefix run once (values: use :meth:`update` to train)."""
        return chunked_logprobs(partial(self._logprobs, temperature=temperature), batch, self._chunk_tokens(),
                                self._prefix)  # fmt: skip

    def update(
        self, batch: TokenBatch, loss_of: LossOf, temperature: float = 1.0, still: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """One optimizer step on ``loss_of(log-probs of batch)``: gradients accumulated chunk by chunk
        (:func:`backward_in_chunks`: memory bounded, nothing recomputed), then the step and the
        learning-rate schedule. ``temperature``: the one the log-probs are taken at (the sampling
        temperature of RL episodes, whose recorded log-probs the loss's ratio divides by; 1 for the
        warm start). ``still``: rows whose gradient is exactly zero, run without autograd (not under
        FSDP, whose ranks must run the same forwards and backwards). Returns the detached loss and stats."""
        opt: Any = self.optimizers()
        sched: Any = self.lr_schedulers()
        opt.zero_grad(set_to_none=True)
        logprobs = partial(self._logprobs, temperature=temperature)
        loss, stats = backward_in_chunks(
            logprobs, batch, loss_of, self._chunk_tokens(), self.manual_backward, self._prefix,
            still if self.device_mesh is None else None,
        )  # fmt: skip
        if self.optim.max_grad_norm:
            self.clip_gradients(opt, gradient_clip_val=self.optim.max_grad_norm, gradient_clip_algorithm="norm")
        opt.step()
        sched.step()
        return loss, stats

    def _chunk_tokens(self) -> int | None:
        # Under FSDP every forward is a collective: ranks must run the same number of them, and how
        # many chunks a batch makes, or whether it shares a prefix, depends on its data, so the sharded
        # path never splits.
        if self.device_mesh is not None or not self.loss_chunk_tokens:
            return None
        device = next(self.policy.parameters()).device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else self.policy.dtype
        return chunk_budget(self.loss_chunk_tokens, dtype)

    def _prefix(self, batch: TokenBatch) -> int:
        """Length of the prefix :meth:`_logprobs` runs once for ``batch``'s rows (0: none)."""
        return shared_prefix_length(batch) if self.share_prefix and self.device_mesh is None else 0

    def _logprobs(self, batch: TokenBatch, temperature: float = 1.0) -> Tensor:
        """Log-probs of ``batch``'s loss tokens under the weights that train on them (the policy)."""
        return self._model_logprobs(self.policy, batch, temperature)

    def _model_logprobs(self, model: Any, batch: TokenBatch, temperature: float = 1.0) -> Tensor:
        prefix = self._prefix(batch)
        if prefix:
            return prefix_shared_logprobs(model, batch, prefix, temperature=temperature)
        return selected_logprobs(model, batch, temperature=temperature)

    @property
    def loss_temperature(self) -> float:
        """The temperature of the RL loss's log-probs: the training rollouts' sampling temperature,
        whose log-probs the engine records (greedy, ``0``, records them at temperature 1)."""
        t = self.sampling.temperature
        return t if t > 0 else 1.0

    def _no_episodes(self) -> str:
        """What to change when a warm-start batch holds no grounded episode (true for this run's data config)."""
        from envace.data.grounding import no_episodes_advice

        return no_episodes_advice(getattr(self.trainer, "datamodule", None) if self._trainer is not None else None)

    def sft_step(self, batch: TokenBatch, split: str) -> Tensor:
        """Role-weighted NLL on grounded episodes: an update in training, the loss alone in validation."""

        def loss_of(logprobs: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            return self.sft_loss({"logprobs": logprobs, "roles": batch.roles, "loss_mask": batch.loss_mask})

        loss, stats = self.update(batch, loss_of) if split == "train" else loss_of(self.token_logprobs(batch))
        self.log_stats(f"{split}/sft", {"loss": loss, **stats}, batch.input_ids.shape[0])
        return loss

    # --- rollouts --------------------------------------------------------------------------------
    @property
    def engine(self) -> SamplingEngine:
        if self._engine is None:
            self._engine = make_engine(self.policy, self.tokenizer, self.fmt, self.sampling)
        return self._engine

    def rollout(self, responder: Responder, lockstep: bool = False) -> Rollout:
        return make_rollout(self.engine, self.tokenizer, self.fmt, responder, self.limits, lockstep=lockstep)

    def run_episodes(
        self, tasks: list[Task], group_size: int, responder: Responder, lockstep: bool = False
    ) -> RolloutResult:
        """Roll out ``group_size`` episodes per task: the episodes and the rollout's counts."""
        with unsharded(self):
            return self.rollout(responder, lockstep).timed(tasks, group_size)

    def rehearsal(self) -> Responder:
        """Who rehearses in the imagined validation family: the weights that write tool turns in
        training (the policy; a ``separate`` or ``simulator`` arm's simulator)."""
        return PolicyRehearsal(engine=self.engine)

    def engines(self) -> list[SamplingEngine]:
        """Every engine that samples in this module's rollouts."""
        return [self.engine]

    def validation_step(self, batch: StepBatch, batch_idx: int) -> ValStepOutput | None:
        """Two families of episodes, generated together (greedy by default, ``val_temperature``):

        * **committed** — the policy acts against the real environment, with the training limits;
          each episode is scored by the training proxy here and by the benchmark's official checker
          in ``RolloutLogger`` (:func:`envace.callbacks.rollout.official_scores`, as for training
          episodes): the figure comparable across training arms and with ``envace evaluate``;
        * **imagined** — the policy's calls are answered by its rehearsing weights (:meth:`rehearsal`:
          the policy's own, or an arm's simulator) beside a lockstep real environment: rehearsal
          fidelity of its own calls; with ``val_gold_fidelity`` also of the gold calls (the oracle
          acts, the same weights rehearse), whatever the policy would have called.
        """
        if not batch.tasks:
            return None
        with kept_rng(), ExitStack() as stack, unsharded(self):
            for engine in self.engines():
                stack.enter_context(engine.decoding(self.val_temperature))
            jobs = [Job(self.rollout(RealEnvironment()), batch.tasks, self.val_group_size),
                    Job(self.rollout(self.rehearsal(), lockstep=True), batch.tasks, self.val_group_size)]  # fmt: skip
            if self.val_gold_fidelity:
                jobs.append(Job(self.gold_rollout(), batch.tasks))
            committed, imagined, *gold = run_together(jobs)
        return ValStepOutput(
            committed=committed,
            proxy=[self.reward(e) for e in committed],
            imagined=imagined,
            imagined_proxy=[self.reward(e) for e in imagined],
            gold_episodes=gold[0] if gold else [],
        )

    def reward(self, episode: Episode) -> RewardOutput:
        """The episode's task reward: masked when it cannot be computed (a judge outage); 0 when a limit
        the benchmark's scorer fails outright ended it (``rewards.LIMIT_FAILS``); a reward that raises
        is a bug and stops the run, the message naming the step, the task and the reward."""
        traj = episode.trajectory()  # under drift: the canonical task, messages and calls (docs/drift.md)
        try:
            return compute_reward(traj.task, traj, judge=self.judge, ended_by=episode.flags)
        except RewardError as exc:
            raise RewardError(f"step {self.global_step}: {exc}") from exc.__cause__

    def gold_rollout(self) -> Rollout:
        """The oracle acts (one gold call an act step, as training episodes are laid out), the weights that
        rehearse (:meth:`rehearsal`) answer, a real environment in lockstep."""
        return gold_rollout(self.tokenizer, self.fmt, self.engine.stop_ids, self.rehearsal(), self.limits)

    # --- checkpoints -----------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the policy spec (plain data: the file opens with ``torch.load(weights_only=True)``
        in ``envace show``/``evaluate``); with LoRA, keep only the trainable weights: the frozen
        base is rebuilt from the spec."""
        checkpoint["envace"] = {
            "policy": dataclasses.asdict(self.policy_spec),
            "tool_style": self.fmt.tool_style,
            "rng": rng_state(),  # the rollouts' seeds come from the global generators
        }
        if self.policy_spec.lora is None or self.device_mesh is not None:
            return
        kept = self.saved_weights()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in kept}

    def saved_weights(self) -> set[str]:
        """State-dict keys a LoRA checkpoint keeps: the trainable weights (the base is rebuilt)."""
        return {f"policy.{n}" for n, p in self.policy.named_parameters() if p.requires_grad}

    def on_train_end(self) -> None:
        """Leave the fit's final weights in ``last.ckpt`` when it stops between two periodic saves:
        Lightning 2.6's ``ModelCheckpoint.on_train_end`` saves ``last`` only if no ``last`` was saved
        during the fit, so a fit of 124 steps saving every 8 kept step 120's as its last."""
        for cb in self.trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.save_last and cb._last_global_step_saved != self.global_step:
                cb._save_last_checkpoint(self.trainer, cb._monitor_candidates(self.trainer))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the random streams' states for :meth:`on_train_batch_start`."""
        self._resumed_rng = (checkpoint.get("envace") or {}).get("rng")

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """On the first step after a resume, the random streams continue where the interrupted run
        left them, so its rollouts draw the episodes the uninterrupted run drew. Not at load time:
        Lightning's loader draws from the global generator when it starts an epoch, after loading."""
        state, self._resumed_rng = getattr(self, "_resumed_rng", None), None
        if state is not None:
            set_rng_state(state)

    def phase_at(self, step: int) -> str:
        """What optimizer step ``step`` trains: ``warm-start`` (grounded supervised) or ``rl``."""
        return "warm-start"

    def log_stats(self, prefix: str, stats: dict[str, Any], batch_size: int) -> None:
        """A step's loss stats as ``<prefix>/<stat>`` scalars (:func:`log_step`: once, at this step),
        and its loss on the progress bar (``loss``)."""
        scalars = {f"{prefix}/{k}": float(v.detach() if isinstance(v, Tensor) else v) for k, v in stats.items()
                   if _is_scalar(v)}  # fmt: skip
        log_step(self, scalars)
        if "loss" in stats:
            self.log("loss", scalars[f"{prefix}/loss"], prog_bar=True, logger=False, batch_size=batch_size)


def _is_scalar(v: Any) -> bool:
    return isinstance(v, int | float) or (isinstance(v, Tensor) and v.numel() == 1)
