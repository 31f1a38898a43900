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
from envace.bench.peak import matmul_gflops, synchronizer
from envace.data.batch import TokenBatch
from envace.data.grounding import ground
from envace.losses import LossInputs
from envace.protocol.tokens import PieceEncoder, encode_trajectory
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


def _precision(dtype: str, device: torch.device) -> AbstractContextManager[Any]:
    return torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()


def update_seconds(module: Any, batch: TokenBatch, dtype: str) -> float:
    """Seconds of one forward and backward pass (log-probs, RoleGRPOLoss), gradients then dropped.

    On the batch's device: the policy's own (``batch.to(device)`` first); on a GPU the time runs to
    the end of the backward's kernels. ``dtype``: ``bf16`` autocasts, else the weights' own dtype."""
    rows, device = batch.input_ids.shape[0], batch.input_ids.device
    sync = synchronizer(device)

    def step() -> None:
        with _precision(dtype, device):
            logprobs = module.token_logprobs(batch)
            loss, _ = module.loss(
                LossInputs(
                    logprobs=logprobs,
                    old_logprobs=batch.logprobs,
                    roles=batch.roles,
                    loss_mask=batch.loss_mask,
                    rewards=torch.ones(rows, device=device),
                    group_ids=torch.arange(rows, device=device),
                )
            )
        loss.backward()
        sync()

    with quiet():
        seconds, _ = timed(step)
    module.policy.zero_grad(set_to_none=True)
    return seconds


def plain_seconds(module: Any, batch: TokenBatch) -> float:
    """Seconds of a plain transformers forward and backward of the same tokens: HF's own loss, the
    vocabulary projection and log-softmax at every position (the reference the loss path improves on)."""

    def step() -> None:
        module.policy(input_ids=batch.input_ids, labels=batch.input_ids, use_cache=False).loss.backward()

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


def _local_peak(size: int, dtypes: tuple[str, ...]) -> dict[str, float]:
    """A quick matmul rate in each of ``dtypes`` (fp32 always), taken right beside an update."""
    kinds = {"fp32": torch.float32, "bf16": torch.bfloat16}
    return {d: matmul_gflops(kinds[d], size, 3) for d in ("fp32", *(d for d in dtypes if d != "fp32"))}


def bench_training(
    module: Any,
    tasks: list[Task],
    lengths: tuple[int, ...],
    reps: int,
    peak_size: int = 1024,
    dtypes: tuple[str, ...] = ("fp32", "bf16"),
) -> dict[str, Any]:
    """Updates per (length, precision in ``dtypes``: ``bf16`` only where the CPU computes it), each
    between two quick peak measurements.

    On a shared machine the matmul peak itself moves (another job takes a core); utilisation is
    therefore taken against the better of the two peaks measured just before and just after each
    update, and of ``reps`` interleaved repetitions the one with the highest utilisation is kept.

    Returns ``runs`` (per length and precision: tokens, seconds, tokens/s, loss positions, model
    GFLOP/s by ``6 · params · tokens``, the local peaks, ``mfu`` over the fp32 one and, for bf16,
    ``mfu_vs_bf16_peak``), ``plain_transformers`` (the same figures for a plain fp32 forward and
    backward of the first length), ``params`` and ``optimizer_step_seconds``.
    """
    params = param_count(module.policy)
    module.policy.train()
    batches = {n: episode_window(module, tasks, n) for n in lengths}
    for dtype in dtypes:  # warm-up: first-call allocations and kernel selection
        update_seconds(module, batches[lengths[0]], dtype)
    best: dict[tuple[int, str], dict[str, Any]] = {}
    for _ in range(reps):
        for n in lengths:
            for dtype in dtypes:
                before = _local_peak(peak_size, dtypes)
                seconds = update_seconds(module, batches[n], dtype)
                after = _local_peak(peak_size, dtypes)
                run = _run_figures(n, dtype, seconds, params, batches[n], before, after)
                if (n, dtype) not in best or run["mfu"] > best[n, dtype]["mfu"]:
                    best[n, dtype] = run
    n = lengths[0]
    plain = []
    for _ in range(reps):
        before = _local_peak(peak_size, dtypes)
        seconds = plain_seconds(module, batches[n])
        plain.append(_run_figures(n, "fp32", seconds, params, batches[n], before, _local_peak(peak_size, dtypes)))
    return {
        "params": params,
        "runs": list(best.values()),
        "plain_transformers": max(plain, key=lambda r: r["mfu"]),
        "optimizer_step_seconds": round(optimizer_seconds(module), 4),
    }


def _run_figures(
    n: int, dtype: str, seconds: float, params: int, batch: TokenBatch, *peaks: dict[str, float]
) -> dict[str, Any]:
    """Throughput and utilisation of one update against the better of ``peaks``."""
    gflops = 6 * params * n / seconds / 1e9
    peak = {k: max(p[k] for p in peaks) for k in peaks[0]}
    run = {
        "tokens": n,
        "dtype": dtype,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(n / seconds, 1),
        "loss_positions": int(batch.loss_mask[0, 1:].sum()),
        "model_gflops": round(gflops, 2),
        "local_peak_gflops": {k: round(v, 1) for k, v in peak.items()},
        "mfu": round(gflops / peak["fp32"], 4),
    }
    if dtype == "bf16":
        run["mfu_vs_bf16_peak"] = round(gflops / peak["bf16"], 4)
    return run


def add_utilisation(training: dict[str, Any], peak: dict[str, Any]) -> None:
    """``mfu_vs_run_peak``: utilisation against the best fp32 peak of the whole run (the strictest)."""
    for run in [*training["runs"], training["plain_transformers"]]:
        run["mfu_vs_run_peak"] = round(run["model_gflops"] / peak["fp32_gflops"], 4)
