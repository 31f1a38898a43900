"""What every EnvACE LightningModule shares: the policy built in ``configure_model`` (FSDP2-ready),
the optimizer, and per-token log-probs computed only where the loss needs them."""

from __future__ import annotations

import dataclasses
import random
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache

from envace.data.batch import StepBatch, TokenBatch
from envace.losses import RoleNLLLoss, gather_logprobs
from envace.policy import PolicySpec, load_model, load_tokenizer
from envace.protocol.episode import PieceEncoder
from envace.protocol.render import ChatFormat, make_format
from envace.rewards import JudgeSettings, RewardOutput, compute_reward
from envace.rollout import (
    GenerationEngine,
    PolicyRehearsal,
    Responder,
    Rollout,
    RolloutLimits,
    SamplingConfig,
    make_engine,
    make_rollout,
    summarize,
)
from envace.rollout.reference import OracleEngine
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


def selected_logprobs(model: Any, batch: TokenBatch, chunk_size: int = 512) -> Tensor:
    """``[B, T]`` log-probs of each token given its prefix, computed only at loss positions.

    Position ``t`` holds ``log p(input_ids[t] | input_ids[:t])`` where ``loss_mask[:, t]`` is set in
    any row, else 0. The LM head and log-softmax run only on those positions (``logits_to_keep``
    with an index tensor): the long tool block and user turns never reach the vocabulary projection.
    """
    mask = batch.loss_mask.bool()
    mask[:, 0] = False  # the first token has no prefix
    positions = mask.any(dim=0).nonzero().squeeze(-1)  # token positions whose log-prob is needed
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    if positions.numel() == 0:
        return out + 0.0 * next(p for p in model.parameters() if p.requires_grad).sum()
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=positions - 1, use_cache=False
    ).logits  # logits at t-1 predict token t
    lp = gather_logprobs(logits, batch.input_ids[:, positions], chunk_size)
    return out.index_copy(1, positions, lp)


def shared_prefix_length(batch: TokenBatch, minimum: int = 64) -> int:
    """Length of the context prefix every row shares (0 when shorter than ``minimum``).

    It stops before the first position whose log-prob the loss needs, so that position's logits
    still come from the per-row part.
    """
    ids, mask = batch.input_ids, batch.loss_mask.bool()
    same = (ids == ids[:1]).all(dim=0) & batch.attention_mask.bool().all(dim=0)
    differs = (~same).nonzero()
    n = int(differs[0]) if len(differs) else ids.shape[1]
    needed = mask.any(dim=0).nonzero()
    if len(needed):
        n = min(n, int(needed[0]) - 1)
    return n if n >= minimum and ids.shape[0] > 1 else 0


def prefix_shared_logprobs(model: Any, batch: TokenBatch, prefix: int, chunk_size: int = 512) -> Tensor:
    """:func:`selected_logprobs` with the shared prefix run once instead of once per row.

    A group's episodes share the system turn with its tool block; its keys and values are computed
    for one row and expanded to the batch (autograd sums the gradient of every row back into them),
    then each row's own part attends to them. Same values and gradients, ``(B - 1) * prefix`` fewer
    tokens through the network.
    """
    batch_size = batch.input_ids.shape[0]
    cache = DynamicCache(config=_config(model))
    model(input_ids=batch.input_ids[:1, :prefix], cache=cache, use_cache=True, logits_to_keep=1)
    shared = DynamicCache(
        ddp_cache_data=[
            (layer.keys.expand(batch_size, -1, -1, -1), layer.values.expand(batch_size, -1, -1, -1))  # type: ignore[union-attr]
            for layer in cache.layers
        ],
        config=_config(model),
    )
    rest = TokenBatch(*(t[:, prefix:] for t in batch))
    mask = batch.loss_mask.bool()[:, prefix:]
    positions = mask.any(dim=0).nonzero().squeeze(-1)  # needed positions within the per-row part
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    if positions.numel() == 0:
        return out
    logits = model(
        input_ids=rest.input_ids,
        attention_mask=batch.attention_mask,  # prefix + rows: the mask covers the cached positions too
        cache=shared,
        use_cache=True,
        logits_to_keep=positions - 1,
    ).logits
    lp = gather_logprobs(logits, rest.input_ids[:, positions], chunk_size)
    return out.index_copy(1, positions + prefix, lp)


def row_chunks(batch: TokenBatch, max_tokens: int, prefix_of: Callable[[TokenBatch], int] | None = None) -> list[slice]:
    """Consecutive row ranges whose forward runs at most ``max_tokens`` tokens: rows × their longest
    row, less what ``prefix_of`` (the shared prefix a forward runs once, e.g. a group's system turn)
    saves. A row longer than that is a chunk of its own.

    >>> mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4] * 2)  # rows of 6, 2, 6, 2 tokens
    >>> b = TokenBatch(*(torch.ones(4, 6),) * 5)._replace(attention_mask=mask)
    >>> [(c.start, c.stop) for c in row_chunks(b, 12)], [(c.start, c.stop) for c in row_chunks(b, 5)]
    ([(0, 2), (2, 4)], [(0, 1), (1, 2), (2, 3), (3, 4)])
    """
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]

    def cost(rows: slice) -> int:
        n, longest = rows.stop - rows.start, max(lengths[rows])
        prefix = prefix_of(TokenBatch(*(t[rows, :longest] for t in batch))) if prefix_of and n > 1 else 0
        return prefix + n * (longest - prefix)

    chunks, start = [], 0
    for row in range(1, len(lengths)):
        if cost(slice(start, row + 1)) > max_tokens:
            chunks.append(slice(start, row))
            start = row
    chunks.append(slice(start, len(lengths)))
    return chunks


def chunked_logprobs(
    fn: Callable[[TokenBatch], Tensor],
    batch: TokenBatch,
    max_tokens: int | None,
    prefix_of: Callable[[TokenBatch], int] | None = None,
) -> Tensor:
    """``fn(batch)`` (``[B, T]`` log-probs) over row chunks of at most ``max_tokens`` padded tokens, for
    values without gradients (validation, the KL reference): one chunk's activations at a time. A
    batch that fits, or ``max_tokens=None``, runs ``fn`` on it directly."""
    chunks = row_chunks(batch, max_tokens, prefix_of) if max_tokens else []
    if len(chunks) <= 1:
        return fn(batch)
    return torch.cat([_chunk_logprobs(fn, batch, rows) for rows in chunks])


def _chunk_logprobs(fn: Callable[[TokenBatch], Tensor], batch: TokenBatch, rows: slice) -> Tensor:
    """``fn`` on ``batch``'s rows ``rows``, trimmed to their longest row (right padding), padded back to ``T``."""
    width = int(batch.attention_mask[rows].sum(dim=1).max())
    lp = fn(TokenBatch(*(t[rows, :width] for t in batch)))
    return torch.nn.functional.pad(lp, (0, batch.input_ids.shape[1] - width))


def chunk_budget(tokens_at_16_bit: int, activations: torch.dtype) -> int:
    """Tokens per loss chunk for ``activations`` of that dtype, at the memory ``tokens_at_16_bit``
    16-bit tokens take (activations scale with the element size).

    >>> chunk_budget(2048, torch.bfloat16), chunk_budget(2048, torch.float32)
    (2048, 1024)
    """
    return max(1, tokens_at_16_bit * 2 // torch.empty(0, dtype=activations).element_size())


LossOf = Callable[[Tensor], tuple[Tensor, dict[str, Tensor]]]


def backward_in_chunks(
    fn: Callable[[TokenBatch], Tensor],
    batch: TokenBatch,
    loss_of: LossOf,
    max_tokens: int | None,
    backward: Callable[[Tensor], Any] = Tensor.backward,
    prefix_of: Callable[[TokenBatch], int] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Accumulate the gradient of ``loss_of(fn(batch))`` one row chunk at a time; returns the detached
    loss and stats of the whole batch.

    Each chunk of at most ``max_tokens`` padded tokens (:func:`row_chunks`) is run forward, and the
    loss is taken with the chunk's log-probs in their rows and constants elsewhere, then backward at
    once (rows not run yet hold ``batch.logprobs``, the sampling log-probs, as constants): the
    activations alive at a time are one chunk's, whatever the number or length of the episodes,
    and nothing is recomputed. Exact for every loss in which a row's gradient does not
    depend on the other rows' log-probs (token or sequence means with normalisers from the masks,
    advantages from the rewards: both EnvACE losses); ``tests/modules/test_logprobs.py`` checks the
    gradients against one backward over the whole batch.
    """
    chunks = row_chunks(batch, max_tokens, prefix_of) if max_tokens else []
    if len(chunks) <= 1:
        loss, stats = loss_of(fn(batch))
        backward(loss)
        return loss.detach(), stats
    values = batch.logprobs.detach().float().clone()  # rows not yet run: the sampling log-probs (ratio 1)
    for rows in chunks:
        lp = _chunk_logprobs(fn, batch, rows)
        placed = torch.cat([values[: rows.start], lp, values[rows.stop :]])
        part, _ = loss_of(placed)
        backward(part)
        values[rows] = lp.detach()
    with torch.no_grad():
        loss, stats = loss_of(values)
    return loss, stats


def _config(model: Any) -> Any:
    return getattr(model, "config", None) or model.get_base_model().config


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
        rehearse_tokens: most tokens of one rehearsed tool response.
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
            episodes: ``scripts/update_memory.py`` measures it. ``None``: one forward over the whole
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
        rehearse_tokens: int = 128,
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
        self.rehearse_tokens = rehearse_tokens
        self.val_group_size = val_group_size
        self.val_temperature = val_temperature
        self.share_prefix = share_prefix
        self.val_gold_fidelity = val_gold_fidelity
        self.sft_loss = sft_loss or RoleNLLLoss()
        self.loss_chunk_tokens = loss_chunk_tokens
        self.judge = judge
        self._engine: GenerationEngine | None = None
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
            self._shard(self.device_mesh)

    def _shard(self, mesh: Any) -> None:
        """FSDP2: ``fully_shard`` each decoder layer, then the whole model (DESIGN.md §3.8)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dp_mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
        mp = MixedPrecisionPolicy(param_dtype=self.policy.dtype, reduce_dtype=torch.float32)
        for module in self.policy.modules():
            if type(module).__name__ in self.fsdp_layer_names:
                fully_shard(module, mesh=dp_mesh, mp_policy=mp)
        fully_shard(self.policy, mesh=dp_mesh, mp_policy=mp)

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

    def token_logprobs(self, batch: TokenBatch) -> Tensor:
        """Per-token log-probs of the current policy at loss positions, each row chunk's shared prefix
        run once (values: use :meth:`update` to train)."""
        return chunked_logprobs(self._logprobs, batch, self._chunk_tokens(), self._prefix)

    def update(self, batch: TokenBatch, loss_of: LossOf) -> tuple[Tensor, dict[str, Tensor]]:
        """One optimizer step on ``loss_of(log-probs of batch)``: gradients accumulated chunk by chunk
        (:func:`backward_in_chunks`: memory bounded, nothing recomputed), then the step and the
        learning-rate schedule. Returns the detached loss and stats."""
        opt: Any = self.optimizers()
        sched: Any = self.lr_schedulers()
        opt.zero_grad(set_to_none=True)
        loss, stats = backward_in_chunks(
            self._logprobs, batch, loss_of, self._chunk_tokens(), self.manual_backward, self._prefix
        )
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

    def _logprobs(self, batch: TokenBatch) -> Tensor:
        prefix = self._prefix(batch)
        if prefix:
            return prefix_shared_logprobs(self.policy, batch, prefix)
        return selected_logprobs(self.policy, batch)

    def sft_step(self, batch: TokenBatch, split: str) -> Tensor:
        """Role-weighted NLL on grounded episodes: an update in training, the loss alone in validation."""

        def loss_of(logprobs: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            return self.sft_loss({"logprobs": logprobs, "roles": batch.roles, "loss_mask": batch.loss_mask})

        loss, stats = self.update(batch, loss_of) if split == "train" else loss_of(self.token_logprobs(batch))
        self.log_stats(f"{split}/sft", {"loss": loss, **stats}, batch.input_ids.shape[0])
        return loss

    # --- rollouts --------------------------------------------------------------------------------
    @property
    def engine(self) -> GenerationEngine:
        if self._engine is None:
            self._engine = make_engine(self.policy, self.tokenizer, self.fmt, self.sampling)
        return self._engine

    def rollout(self, responder: Responder, lockstep: bool = False) -> Rollout:
        return make_rollout(self.engine, self.tokenizer, self.fmt, responder, self.limits, lockstep=lockstep)

    def run_episodes(self, tasks: list[Task], group_size: int, responder: Responder, lockstep: bool = False) -> Rollout:
        """Roll out ``group_size`` episodes per task; returns the rollout with ``episodes`` and ``stats``."""
        ro = self.rollout(responder, lockstep)
        began = time.perf_counter()
        with unsharded(self.policy):
            ro.episodes = ro.run(tasks, group_size)  # type: ignore[attr-defined]
        ro.stats = summarize(ro.episodes, time.perf_counter() - began, self.engine)  # type: ignore[attr-defined]
        return ro

    def validation_step(self, batch: StepBatch, batch_idx: int) -> dict[str, Any] | None:
        """Imagined episodes with a lockstep real environment: rewards here, fidelity in the callback.

        With ``val_gold_fidelity`` a second rollout has the gold calls written for the policy (the
        oracle acts) while the policy rehearses every response: fidelity of the world model on the
        calls that matter, whatever the policy would have called (``fidelity_gold/*``).
        """
        if not batch.tasks:
            return None
        with kept_rng(), self.engine.decoding(self.val_temperature):  # validation moves no training stream
            responder = PolicyRehearsal(self.rehearse_tokens)
            ro = self.run_episodes(batch.tasks, self.val_group_size, responder, lockstep=True)
            episodes = ro.episodes  # type: ignore[attr-defined]
            out = {"episodes": episodes, "rewards": [self.reward(e) for e in episodes]}
            if self.val_gold_fidelity:
                out["gold_episodes"] = self.gold_rehearsals(batch.tasks)
        return out

    def reward(self, episode: Any) -> RewardOutput:
        """The episode's task reward (masked, never raising, when it cannot be computed)."""
        return compute_reward(episode.task, episode.trajectory(), judge=self.judge)

    def gold_rehearsals(self, tasks: list[Task]) -> list[Any]:
        """Episodes whose acts are the gold calls and whose tool turns the policy rehearses."""
        oracle = OracleEngine(self.tokenizer, self.engine.stop_ids)
        limits = dataclasses.replace(self.limits, max_new_tokens=4096, max_calls_per_step=64,
                                     max_episode_tokens=self.limits.max_episode_tokens * 4)  # fmt: skip
        rollout = Rollout(oracle, self.fmt, PieceEncoder(self.tokenizer), PolicyRehearsal(self.rehearse_tokens,
                          engine=self.engine), limits, lockstep=True, validate_calls=False)  # fmt: skip
        with unsharded(self.policy):
            return rollout.run(tasks, 1)

    # --- checkpoints -----------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the policy spec (plain data: the file opens with ``torch.load(weights_only=True)``
        in ``envace rehearse``/``evaluate``); with LoRA, keep only the trainable weights: the frozen
        base is rebuilt from the spec."""
        checkpoint["envace"] = {
            "policy": dataclasses.asdict(self.policy_spec),
            "tool_style": self.fmt.tool_style,
            "rng": rng_state(),  # the rollouts' seeds come from the global generators
        }
        if self.policy_spec.lora is None or self.device_mesh is not None:
            return
        trainable = {f"policy.{n}" for n, p in self.policy.named_parameters() if p.requires_grad}
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

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

    def log_stats(self, prefix: str, stats: dict[str, Any], batch_size: int) -> None:
        scalars = {f"{prefix}/{k}": float(v.detach() if isinstance(v, Tensor) else v) for k, v in stats.items()
                   if _is_scalar(v)}  # fmt: skip
        self.log_dict(scalars, batch_size=batch_size, sync_dist=False)


def rng_state() -> dict[str, Any]:
    """The global random generators' states (torch CPU, Python, NumPy) as plain data and tensors,
    so a checkpoint holding them still opens with ``torch.load(weights_only=True)``."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    keys = np.asarray(keys)
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


@contextmanager
def kept_rng() -> Iterator[None]:
    """Run the block without moving the global random generators (validation between training steps)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


@contextmanager
def unsharded(model: Any) -> Iterator[None]:
    """Hold FSDP2-sharded parameters gathered while generating.

    Ranks generate different episodes, so they run different numbers of forward passes; with
    sharded parameters every forward is a collective and unequal counts would deadlock. Gathering
    once (``unshard``, no reshard after forward) makes generation local to each rank.
    """
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in sharded:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in sharded:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def _is_scalar(v: Any) -> bool:
    return isinstance(v, int | float) or (isinstance(v, Tensor) and v.numel() == 1)
