"""Training throughput: one EnvACE update through the module's own loss path.

The update is what ``EnvACEModule.rl_step`` does after its rollout: per-token log-probs at loss
positions (:meth:`~envace.modules.base.PolicyModule.token_logprobs`: the LM head runs only where a
log-prob is needed), then :class:`~envace.losses.RoleGRPOLoss`, then the backward pass. The tokens
are the last ``N`` of grounded BFCL multi-turn episodes laid end to end (compact tools), so act and
rehearse turns appear in their natural share. Model FLOP utilisation is ``6 · params · N`` over the
time of the update and the measured fp32 matmul peak; ``bf16`` is autocast to bfloat16 with fp32
master weights (Lightning's ``precision: bf16-mixed``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from envace.bench.common import param_count, quiet, timed
from envace.data.batch import TokenBatch
from envace.data.grounding import ground
from envace.losses import LossInputs
from envace.protocol.episode import PieceEncoder, encode_trajectory
from envace.types import Task


def episode_window(module: Any, tasks: list[Task], n_tokens: int) -> TokenBatch:
    """The last ``n_tokens`` of grounded episodes of ``tasks`` laid end to end, as a one-row batch."""
    encode = PieceEncoder(module.tokenizer)
    ids: list[int] = []
    roles: list[int] = []
    for task in tasks:
        ep = encode_trajectory(ground(task), encode, module.fmt)
        ids, roles = ids + ep.ids, roles + ep.roles
        if len(ids) >= n_tokens:
            break
    if len(ids) < n_tokens:
        raise ValueError(f"grounded episodes hold {len(ids)} tokens, fewer than {n_tokens}")
    t = torch.tensor(ids[-n_tokens:])[None]
    r = torch.tensor(roles[-n_tokens:])[None]
    mask = (r > 0).float()
    return TokenBatch(t, torch.ones_like(t), r, mask, torch.zeros_like(mask))


def _precision(dtype: str) -> AbstractContextManager[Any]:
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()


def update_seconds(module: Any, batch: TokenBatch, dtype: str) -> float:
    """Seconds of one forward and backward pass (log-probs, RoleGRPOLoss), gradients then dropped."""
    rows = batch.input_ids.shape[0]

    def step() -> None:
        with _precision(dtype):
            logprobs = module.token_logprobs(batch)
            loss, _ = module.loss(
                LossInputs(
                    logprobs=logprobs,
                    old_logprobs=batch.logprobs,
                    roles=batch.roles,
                    loss_mask=batch.loss_mask,
                    rewards=torch.ones(rows),
                    group_ids=torch.arange(rows),
                )
            )
        loss.backward()

    with quiet():
        seconds, _ = timed(step)
    module.policy.zero_grad(set_to_none=True)
    return seconds


def optimizer_seconds(module: Any) -> float:
    """Seconds of one AdamW step over every trainable weight (the second step: state exists)."""
    params = [p for p in module.policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-7)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    seconds, _ = timed(opt.step)
    module.policy.zero_grad(set_to_none=True)
    return seconds


def bench_training(
    module: Any,
    tasks: list[Task],
    lengths: tuple[int, ...],
    reps: int,
    dtypes: tuple[str, ...] = ("fp32", "bf16"),
) -> dict[str, Any]:
    """Fastest of ``reps`` updates per (length, precision), interleaved so that load drifts hit all alike.

    Returns ``runs`` (one per length and precision: tokens, seconds, tokens/s, loss positions,
    achieved GFLOP/s by ``6 · params · tokens``), ``params`` and ``optimizer_step_seconds``; the
    caller adds utilisation once the peak is known.
    """
    params = param_count(module.policy)
    module.policy.train()
    batches = {n: episode_window(module, tasks, n) for n in lengths}
    for dtype in dtypes:  # warm-up: first-call allocations and kernel selection
        update_seconds(module, batches[lengths[0]], dtype)
    best: dict[tuple[int, str], float] = {}
    for _ in range(reps):
        for n in lengths:
            for dtype in dtypes:
                s = update_seconds(module, batches[n], dtype)
                best[n, dtype] = min(best.get((n, dtype), float("inf")), s)
    runs = []
    for (n, dtype), s in best.items():
        positions = int(batches[n].loss_mask[0, 1:].sum())
        runs.append(
            {
                "tokens": n,
                "dtype": dtype,
                "seconds": round(s, 4),
                "tokens_per_s": round(n / s, 1),
                "loss_positions": positions,
                "model_gflops": round(6 * params * n / s / 1e9, 2),
            }
        )
    return {"params": params, "runs": runs, "optimizer_step_seconds": round(optimizer_seconds(module), 4)}


def add_utilisation(training: dict[str, Any], peak: dict[str, Any]) -> None:
    """``mfu`` (over the fp32 peak, the figure of record) and ``mfu_vs_bf16_peak`` for bf16 runs."""
    for run in training["runs"]:
        run["mfu"] = round(run["model_gflops"] / peak["fp32_gflops"], 4)
        if run["dtype"] == "bf16":
            run["mfu_vs_bf16_peak"] = round(run["model_gflops"] / peak["bf16_gflops"], 4)
