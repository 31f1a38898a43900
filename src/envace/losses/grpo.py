"""Role-wise GRPO: group-relative advantages with one baseline per role, and the clipped surrogate.

Pure tensor functions (tensors in, ``(loss, stats)`` out); :class:`RoleGRPOLoss` wraps them as a
small ``nn.Module`` so that a config picks it by ``class_path``.

Notation (docs/design.md §1, §3.6). A group g holds the G episodes sampled for one task. Episode i has
one trajectory reward R_i, given to both roles. Role r ∈ {act, rehearse}; S_{g,r} is the set of the
group's valid episodes that contain at least one sampled token of role r. The role-wise advantage is

    A_{i,r} = (R_i − mean_{j ∈ S_{g,r}} R_j) [/ (std_{j ∈ S_{g,r}} R_j + ε)]            (1)

and every sampled token t of role r in episode i gets A_{i,t} = A_{i,r}. The per-token PPO loss is

    ρ_t = exp(log π(y_t) − log π_old(y_t))
    ℓ_t = −min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t) + β k3_t                    (2)
    k3_t = exp(log π_ref − log π) − (log π_ref − log π) − 1

and the batch loss is the weighted token mean  L = Σ_t w_t ℓ_t / N,  with w_t the loss weight of
token t's role (0 on context and unsampled tokens) and N the number of tokens with w_t > 0.

Role columns: every ``[B, R]`` tensor here is indexed by role id (``envace.types.ROLE_IDS``:
0 context, 1 act, 2 rehearse), so ``R == 3`` and column 0 is never used (context tokens are not
trained). A larger R is allowed for future roles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from envace.types import ROLE_IDS

N_ROLES = len(ROLE_IDS)
TRAINED_ROLES = tuple(r for r in ROLE_IDS if r != "context")


class LossInputs(NamedTuple):
    """What :class:`RoleGRPOLoss` reads from a batch. Shapes: B episodes, T tokens.

    Attributes:
        logprobs: ``[B, T]`` float, log-prob under the current policy of the token at each position
            (already gathered and shifted by the caller; carries the gradient).
        old_logprobs: ``[B, T]`` float, the log-probs recorded when the token was sampled.
        roles: ``[B, T]`` long, role id of each token (0 context, 1 act, 2 rehearse).
        loss_mask: ``[B, T]`` bool/float, 1 on tokens the policy sampled.
        rewards: ``[B]`` float, trajectory reward; NaN marks a masked episode (reward ``None``).
        group_ids: ``[B]`` long, episodes of the same task share an id.
        valid: ``[B]`` bool or ``None`` (then ``isfinite(rewards)``); ``False`` masks the episode.
        ref_logprobs: ``[B, T]`` reference log-probs, or ``None`` (needed when ``kl_coef > 0``).
        role_counts: ``[B, R]`` invocations per role, or ``None`` (then counted as sampled spans).
    """

    logprobs: Tensor
    old_logprobs: Tensor
    roles: Tensor
    loss_mask: Tensor
    rewards: Tensor
    group_ids: Tensor
    valid: Tensor | None = None
    ref_logprobs: Tensor | None = None
    role_counts: Tensor | None = None


def _group_index(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(onehot [G, B] float, inverse [B])`` for the distinct ids of ``group_ids``."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    onehot = torch.zeros(n_groups, group_ids.numel(), dtype=torch.float64, device=group_ids.device)
    onehot[inverse, torch.arange(group_ids.numel(), device=group_ids.device)] = 1.0
    return onehot, inverse


def _spread(values: Tensor, member: Tensor) -> tuple[Tensor, Tensor]:
    """``(amax, amin)`` of ``values [B]`` over each set ``member [G, B, R]`` (bool), as ``[G, R]``;
    an empty set gives ``(-inf, inf)``, so ``amax <= amin`` means "at most one distinct value"."""
    v = values[None, :, None].expand_as(member)
    amax = torch.where(member, v, torch.full_like(v, -torch.inf)).amax(dim=1)
    amin = torch.where(member, v, torch.full_like(v, torch.inf)).amin(dim=1)
    return amax, amin


def rolewise_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    role_present: Tensor,
    valid: Tensor | None = None,
    by: Literal["episode", "invocation"] = "episode",
    role_counts: Tensor | None = None,
    scale_std: bool = False,
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Equation (1): the advantage of each (episode, role) against its group's same-role baseline.

    Args:
        rewards: ``[B]`` trajectory rewards; non-finite entries are treated as masked.
        group_ids: ``[B]`` group (task) id of each episode.
        role_present: ``[B, R]`` bool, episode i sampled at least one token of role r.
        valid: ``[B]`` bool; ``False`` masks the episode: it joins no baseline and gets advantage 0.
        by: ``"episode"`` weighs each episode once in the baseline of a role it contains;
            ``"invocation"`` weighs it by its number of invocations of the role (``role_counts``),
            which is the mean over rows when each invocation is a row, as upstream counts.
        role_counts: ``[B, R]`` invocations per role; required for ``by="invocation"``.
        scale_std: divide by the (population, ddof 0, same weights) std of the baseline's set plus ``eps``.
        eps: added to the std when ``scale_std``.

    Returns:
        ``adv [B, R]`` (float32, 0 where the role is absent or the episode masked) and stats:
        ``adv/zero_group_frac`` — fraction of groups with ≥ 1 valid episode whose valid rewards are
        all equal (they carry no signal); ``reward/group_std`` — mean over those groups of the
        population std of their valid rewards; ``reward/valid_frac`` — fraction of valid episodes.
        A (group, role) set whose rewards are all equal gets exactly 0 (not a rounding residue).
    """
    role_present = role_present.bool()
    ok = torch.isfinite(rewards) if valid is None else valid.bool() & torch.isfinite(rewards)
    r = torch.where(ok, rewards, torch.zeros_like(rewards)).to(torch.float64)
    member = role_present & ok[:, None]  # [B, R]
    if by == "episode":
        w = member.to(torch.float64)
    elif by == "invocation":
        if role_counts is None:
            raise ValueError("by='invocation' needs role_counts [B, R]")
        w = role_counts.to(torch.float64) * member
        member = member & (role_counts > 0)
    else:
        raise ValueError(f"by must be 'episode' or 'invocation', got {by!r}")

    onehot, inverse = _group_index(group_ids)  # [G, B], [B]
    n = onehot @ w  # [G, R]
    mean = (onehot @ (w * r[:, None])) / n.clamp_min(1e-12)
    centred = r[:, None] - mean[inverse]  # [B, R]
    gm = onehot.bool()[:, :, None] & member[None]  # [G, B, R]
    amax, amin = _spread(r, gm)
    flat = (amax <= amin)[inverse]  # set of ≤ 1 distinct reward: exactly zero advantage
    adv = torch.where(member & ~flat, centred, torch.zeros_like(centred))
    if scale_std:
        var = (onehot @ (w * centred**2)) / n.clamp_min(1e-12)
        adv = adv / (var.sqrt()[inverse] + eps)

    # group-level stats over all valid episodes, whatever their roles
    gv = onehot * ok.to(torch.float64)[None]  # [G, B]
    n_valid = gv.sum(1)
    has = n_valid > 0
    g_mean = (gv @ r) / n_valid.clamp_min(1)
    g_std = ((gv * (r[None] - g_mean[:, None]) ** 2).sum(1) / n_valid.clamp_min(1)).sqrt()
    gmax, gmin = _spread(r, gv.bool()[:, :, None])
    zero = (gmax[:, 0] <= gmin[:, 0]) & has
    n_has = has.sum().clamp_min(1)
    stats = {
        "adv/zero_group_frac": (zero.sum() / n_has).float(),
        "reward/group_std": (g_std * has).sum().div(n_has).float(),
        "reward/valid_frac": ok.float().mean() if ok.numel() else torch.zeros(()),
    }
    return adv.float(), stats


def role_presence(roles: Tensor, loss_mask: Tensor, n_roles: int = N_ROLES) -> tuple[Tensor, Tensor]:
    """``(present [B, R] bool, counts [B, R] long)`` from the sampled tokens of each episode.

    An invocation is a maximal run of consecutive sampled tokens of one role: each generation is
    one run, and runs are separated by template (context) tokens.

    >>> roles = torch.tensor([[0, 1, 1, 0, 2, 0, 1]]); mask = roles > 0
    >>> present, counts = role_presence(roles, mask)
    >>> counts.tolist()
    [[0, 2, 1]]
    """
    sampled = torch.where(loss_mask.bool(), roles, torch.full_like(roles, -1))
    prev = torch.nn.functional.pad(sampled[:, :-1], (1, 0), value=-1)
    starts = (sampled >= 0) & (sampled != prev)
    onehot = torch.nn.functional.one_hot(sampled.clamp_min(0), n_roles) * (sampled >= 0)[..., None]
    counts = (onehot * starts[..., None]).sum(1)
    return onehot.sum(1) > 0, counts


def token_advantages(adv: Tensor, roles: Tensor) -> Tensor:
    """``[B, T]`` advantage of each token: ``adv[b, roles[b, t]]``, 0 on context (role 0) tokens."""
    tok = adv.gather(1, roles.long().clamp(0, adv.shape[1] - 1))
    return torch.where(roles > 0, tok, torch.zeros_like(tok))


def role_weight_vector(role_weights: Mapping[str, float], n_roles: int = N_ROLES) -> list[float]:
    """Weights indexed by role id; context is always 0. Unknown role names raise."""
    unknown = set(role_weights) - set(TRAINED_ROLES)
    if unknown:
        raise ValueError(f"unknown role(s) {sorted(unknown)}; known: {list(TRAINED_ROLES)}")
    out = [0.0] * n_roles
    for name in TRAINED_ROLES:
        out[ROLE_IDS[name]] = float(role_weights.get(name, 1.0))
    return out


def _token_terms(
    keep: Tensor,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    ref_logprobs: Tensor | None,
    eps_low: float,
    eps_high: float,
    kl_coef: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(ℓ_t, ρ_t, clipped_t, k3_t)`` of equation (2), with every input set to 0 where ``~keep``
    before any arithmetic (so those positions give ℓ_t = 0 and a zero gradient)."""
    zero = torch.zeros_like(logprobs)
    lp = torch.where(keep, logprobs, zero)
    old = torch.where(keep, old_logprobs.detach().to(logprobs.dtype), zero)
    adv = torch.where(keep, advantages.detach().to(logprobs.dtype), zero)
    ratio = torch.exp(lp - old)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = zero
    if ref_logprobs is not None:
        d = torch.where(keep, ref_logprobs.detach().to(logprobs.dtype), zero) - lp
        kl = torch.exp(d) - d - 1.0
        if kl_coef:
            per_token = per_token + kl_coef * kl
    return per_token, ratio, clipped < unclipped, kl


def clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    roles: Tensor,
    loss_mask: Tensor,
    role_weights: Mapping[str, float] | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Equation (2), aggregated as a weighted token mean over the batch.

    Args:
        logprobs: ``[B, T]`` current log-probs (with gradient).
        old_logprobs: ``[B, T]`` sampling-time log-probs (no gradient is taken through them).
        advantages: ``[B, T]`` per-token advantage (:func:`token_advantages`).
        roles: ``[B, T]`` role ids.
        loss_mask: ``[B, T]`` 1 on sampled tokens.
        role_weights: loss weight per role name, default 1 each; a weight-0 token gets exactly zero
            gradient. With shared weights that silences the role's tokens, not its weights:
            ``rehearse: 0`` still moves the world model through the act gradient (configs/arms/).
        clip_eps: ε_low, the ratio is clipped below at 1 − ε_low.
        clip_eps_high: ε_high (clip above at 1 + ε_high); ``None`` means ``clip_eps``.
        ref_logprobs: ``[B, T]`` reference log-probs for the k3 KL term.
        kl_coef: β; the KL term is skipped when 0.

    The denominator N is the number of tokens with ``loss_mask == 1`` and role weight > 0 in the
    whole (micro-)batch, clamped at 1; a role weight therefore scales that role's share linearly
    and weight 0 removes the role's tokens from numerator and denominator alike. Episodes with a
    zero advantage still count in N (as upstream's token mean does).

    Returns:
        ``loss`` (scalar) and detached stats: ``clip_frac`` (weighted tokens whose clipped term was
        the active one), ``ratio_mean``, ``kl`` (mean k3 over weighted tokens, also when β = 0 but
        ``ref_logprobs`` is given), ``tokens/<role>`` (sampled tokens per role), ``loss/<role>``
        (mean ℓ_t over that role's sampled tokens, before weighting).
    """
    weights = torch.tensor(role_weight_vector(role_weights or {}), dtype=logprobs.dtype, device=logprobs.device)
    sampled = loss_mask.bool() & (roles > 0)
    w = torch.where(sampled, weights[roles.long().clamp(0, len(weights) - 1)], torch.zeros_like(logprobs))
    active = w > 0
    if kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    # the loss path sees only weighted tokens: other positions may hold anything (padding, -1e4
    # on a frozen role), and a zero weight must give an exactly zero gradient, not 0 · inf.
    terms = _token_terms(active, logprobs, old_logprobs, advantages, ref_logprobs, clip_eps, hi, kl_coef)
    per_token, ratio, is_clipped, kl = terms
    n = active.sum().clamp_min(1)
    loss = (w * per_token).sum() / n
    with torch.no_grad():
        fa = active.float()
        stats = {
            "clip_frac": (is_clipped & active).sum() / n,
            "ratio_mean": (ratio * fa).sum() / n,
            "kl": (kl * fa).sum() / n,
        }
        # per-role diagnostics over all sampled tokens, weighted or not
        per_sampled = _token_terms(sampled, logprobs, old_logprobs, advantages, ref_logprobs, clip_eps, hi, kl_coef)[0]
        for name in TRAINED_ROLES:
            m = sampled & (roles == ROLE_IDS[name])
            stats[f"tokens/{name}"] = m.sum().float()
            stats[f"loss/{name}"] = (per_sampled * m).sum() / m.sum().clamp_min(1)
    return loss, {k: v.detach().float() for k, v in stats.items()}


def batch_field(batch: Any, name: str) -> Any:
    """``batch[name]`` for a mapping, else ``batch.name``; ``None`` when absent."""
    if isinstance(batch, Mapping):
        return batch.get(name)
    return getattr(batch, name, None)


class RoleGRPOLoss(nn.Module):
    """Role-wise GRPO loss (equations (1) and (2)), picked in configs by ``class_path``.

    Args:
        clip_eps: ε_low of the ratio clip.
        clip_eps_high: ε_high (``None`` = ``clip_eps``; > ε_low is DAPO's clip-higher).
        kl_coef: β of the k3 KL to the reference; 0 (the paper's value) skips it.
        role_weights: loss weight per role, e.g. ``{"act": 1, "rehearse": 0}``: the rehearse tokens get
            no loss (the ``act_loss_only`` ablation; the shared weights still serve both roles).
        adv_by: baseline weighting (see :func:`rolewise_advantages`): ``"invocation"`` (default) is
            upstream's mean over the role's rows, one row per generation; ``"episode"`` counts each
            episode once. Invocations are counted as sampled spans unless the batch gives ``role_counts``.
        scale_std: divide advantages by the group-role std (the paper does not).
    """

    def __init__(
        self,
        clip_eps: float = 0.2,
        clip_eps_high: float | None = None,
        kl_coef: float = 0.0,
        role_weights: dict[str, float] | None = None,
        adv_by: Literal["episode", "invocation"] = "invocation",
        scale_std: bool = False,
    ) -> None:
        super().__init__()
        self.clip_eps = clip_eps
        self.clip_eps_high = clip_eps_high
        self.kl_coef = kl_coef
        self.role_weights = dict(role_weights or {"act": 1.0, "rehearse": 1.0})
        role_weight_vector(self.role_weights)  # validate names now, not at the first step
        self.adv_by = adv_by
        self.scale_std = scale_std

    def forward(self, batch: LossInputs | Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of one batch (:class:`LossInputs` or a mapping with the same keys).

        Masked episodes (``valid`` False or non-finite reward) are removed from the loss entirely:
        their tokens join neither numerator nor denominator, so adding one changes nothing.
        """
        roles, loss_mask = batch_field(batch, "roles"), batch_field(batch, "loss_mask")
        adv, adv_stats, ok = self._advantages(batch)
        loss, stats = clipped_surrogate(
            batch_field(batch, "logprobs"),
            batch_field(batch, "old_logprobs"),
            token_advantages(adv, roles),
            roles,
            loss_mask.bool() & ok[:, None],
            self.role_weights,
            self.clip_eps,
            self.clip_eps_high,
            batch_field(batch, "ref_logprobs"),
            self.kl_coef,
        )
        return loss, {**stats, **adv_stats}

    def _advantages(self, batch: LossInputs | Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """``(adv [B, R], their stats, ok [B])``: equation (1) over the batch's valid episodes."""

        def get(name: str) -> Any:
            return batch_field(batch, name)

        roles, loss_mask, rewards, valid = get("roles"), get("loss_mask"), get("rewards"), get("valid")
        ok = torch.isfinite(rewards) if valid is None else valid.bool() & torch.isfinite(rewards)
        present, counts = role_presence(roles, loss_mask)
        given = get("role_counts")
        adv, stats = rolewise_advantages(
            rewards,
            get("group_ids"),
            present,
            ok,
            by=self.adv_by,
            role_counts=given if given is not None else counts,
            scale_std=self.scale_std,
        )
        return adv, stats, ok

    def still_rows(self, batch: LossInputs | Mapping[str, Tensor]) -> Tensor:
        """``[B]`` bool: the episodes whose gradient in this loss is exactly zero, whatever their
        log-probs — every advantage 0 (a group without reward variance gets exactly 0, not a rounding
        residue) or masked, and no KL term. The update runs them without autograd
        (:func:`~envace.modules.logprobs.backward_in_chunks`). A subclass that adds a term to the loss
        must say here which rows it leaves without gradient."""
        adv, _, ok = self._advantages(batch)
        if self.kl_coef:
            return torch.zeros_like(ok)
        return (adv == 0).all(dim=1) | ~ok
