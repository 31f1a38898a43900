"""Warm-start loss (docs/design.md §3.9): role-weighted negative log-likelihood of grounded episodes,
and the memory-aware log-prob gather shared with the RL loss.

The warm start trains both roles on gold act turns and real tool responses:

    L = − Σ_t w_t log π(y_t) / N,   w_t = weight of token t's role (0 on context/unsampled),
    N = number of tokens with w_t > 0                                                   (3)

which is the token mean of :mod:`envace.losses.grpo` with the advantage replaced by 1 and no ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from envace.losses.grpo import TRAINED_ROLES, batch_field, role_weight_vector
from envace.types import ROLE_IDS


class _TokenLogProbs(torch.autograd.Function):
    """``log_softmax(logits / T)[label]`` in float32, one time chunk at a time, with a hand-written
    backward.

    Forward keeps only the logits (already alive: autograd needs them anyway), the labels and the
    ``[B, T]`` log-normalisers; backward forms ``(g / T) · (onehot(label) − softmax)`` chunk by chunk,
    in about half the passes over ``[B, chunk, V]`` of autograd through ``gather − logsumexp`` (and no
    recomputation of the forward for low-precision logits). The temperature scales each chunk as it
    is read: no scaled copy of the logits is made.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, labels: Tensor, chunk_size: int, temperature: float) -> Tensor:
        out = torch.empty(labels.shape, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for s in range(0, logits.shape[1], chunk_size):
            x = logits[:, s : s + chunk_size].float()
            if temperature != 1.0:
                x = x / temperature  # out of place: ``.float()`` of float32 logits is the logits themselves
            norm = torch.logsumexp(x, dim=-1)
            out[:, s : s + chunk_size] = x.gather(-1, labels[:, s : s + chunk_size, None]).squeeze(-1) - norm
            lse[:, s : s + chunk_size] = norm
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size, ctx.temperature = chunk_size, temperature
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        logits, labels, lse = ctx.saved_tensors
        c, t = ctx.chunk_size, ctx.temperature
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[1], c):
            g = grad_out[:, s : s + c, None].float() / t
            x = logits[:, s : s + c].float()
            if t != 1.0:
                x = x / t
            p = torch.sub(x, lse[:, s : s + c, None]).exp_().mul_(-g)  # −(g / T) · softmax
            grad[:, s : s + c] = p.scatter_add_(-1, labels[:, s : s + c, None], g)  # + g / T at the label
        return grad, None, None, None


def gather_logprobs(logits: Tensor, labels: Tensor, chunk_size: int = 512, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)[b, t, labels[b, t]]`` as ``[B, T]`` float32, without a
    ``[B, T, V]`` copy.

    Args:
        logits: ``[B, T, V]``, any float dtype; positions already aligned with ``labels`` by the
            caller (``logits[:, t]`` predicts ``labels[:, t]``).
        labels: ``[B, T]`` token ids (any valid id on masked positions; pad with 0, not -100).
        chunk_size: time steps per chunk.
        temperature: the softmax temperature the log-probs are taken at: the sampling temperature
            of the tokens, so the RL loss's ratio compares the same distribution the sampler drew
            from (``1`` for the warm start's NLL).

    The log-softmax is ``logit[label] − logsumexp(logits)`` computed one time chunk at a time in
    float32 (:class:`_TokenLogProbs`): at most one ``[B, chunk, V]`` float32 temporary exists at a
    time, in forward and in backward, and nothing of that size is kept between them.
    """
    if labels.numel() == 0:
        return logits.new_zeros(labels.shape, dtype=torch.float32)
    if labels.min() < 0:
        raise ValueError("labels must be valid token ids (got a negative id); mask with loss_mask instead")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    out: Tensor = _TokenLogProbs.apply(logits, labels, chunk_size, float(temperature))
    return out


def role_weighted_nll(
    logprobs: Tensor,
    roles: Tensor,
    loss_mask: Tensor,
    role_weights: Mapping[str, float] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Equation (3).

    Args:
        logprobs: ``[B, T]`` log-probs of the target tokens (with gradient).
        roles: ``[B, T]`` role ids (0 context, 1 act, 2 rehearse).
        loss_mask: ``[B, T]`` 1 on target tokens (the gold act / real response tokens).
        role_weights: weight per role name, default 1 each.

    Returns:
        ``loss`` and detached stats ``tokens/<role>`` and ``nll/<role>`` (mean NLL over the role's
        target tokens, unweighted).
    """
    weights = torch.tensor(role_weight_vector(role_weights or {}), dtype=logprobs.dtype, device=logprobs.device)
    target = loss_mask.bool() & (roles > 0)
    w = torch.where(target, weights[roles.long().clamp(0, len(weights) - 1)], torch.zeros_like(logprobs))
    active = w > 0
    # inputs set to 0 off the weighted tokens before any arithmetic: weight 0 → gradient exactly 0
    loss = (w * -torch.where(active, logprobs, torch.zeros_like(logprobs))).sum() / active.sum().clamp_min(1)
    stats: dict[str, Tensor] = {}
    with torch.no_grad():
        nll = -torch.where(target, logprobs, torch.zeros_like(logprobs))
        for name in TRAINED_ROLES:
            m = target & (roles == ROLE_IDS[name])
            stats[f"tokens/{name}"] = m.sum().float()
            stats[f"nll/{name}"] = ((nll * m).sum() / m.sum().clamp_min(1)).float()
    return loss, stats


class RoleNLLLoss(nn.Module):
    """Role-weighted NLL (equation (3)), picked in configs by ``class_path``.

    Args:
        role_weights: loss weight per role, default ``{"act": 1, "rehearse": 1}``.
    """

    def __init__(self, role_weights: dict[str, float] | None = None) -> None:
        super().__init__()
        self.role_weights = dict(role_weights or {"act": 1.0, "rehearse": 1.0})
        role_weight_vector(self.role_weights)

    def forward(self, batch: Mapping[str, Tensor] | object) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of a batch with ``logprobs``, ``roles`` and ``loss_mask`` (mapping or attributes)."""
        logprobs, roles = batch_field(batch, "logprobs"), batch_field(batch, "roles")
        return role_weighted_nll(logprobs, roles, batch_field(batch, "loss_mask"), self.role_weights)
