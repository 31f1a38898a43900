"""Role-wise GRPO math on hand-worked tensors (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from envace.losses import (
    LossInputs,
    RoleGRPOLoss,
    clipped_surrogate,
    role_presence,
    rolewise_advantages,
    token_advantages,
)

CTX, ACT, REH = 0, 1, 2


def present(*rows: tuple[bool, bool]) -> torch.Tensor:
    """[B, 3] role_present from (act, rehearse) pairs; the context column is always False."""
    return torch.tensor([[False, a, r] for a, r in rows])


def test_per_role_baselines_differ_when_role_sets_differ() -> None:
    # one group of 3: episode 2 made no call, so it has act tokens but no rehearse tokens
    rewards = torch.tensor([1.0, 0.0, 0.2])
    adv, stats = rolewise_advantages(rewards, torch.zeros(3, dtype=torch.long), present((1, 1), (1, 1), (1, 0)))
    # act baseline over {0,1,2}: (1 + 0 + 0.2) / 3 = 0.4 -> 0.6, -0.4, -0.2
    torch.testing.assert_close(adv[:, ACT], torch.tensor([0.6, -0.4, -0.2]))
    # rehearse baseline over {0,1}: (1 + 0) / 2 = 0.5 -> 0.5, -0.5; episode 2 has no rehearse -> 0
    torch.testing.assert_close(adv[:, REH], torch.tensor([0.5, -0.5, 0.0]))
    assert torch.all(adv[:, CTX] == 0)
    # population std of {1, 0, 0.2}: mean 0.4, var (0.36 + 0.16 + 0.04) / 3 = 0.18667
    assert stats["reward/group_std"].item() == pytest.approx(math.sqrt(0.56 / 3), rel=1e-6)
    assert stats["adv/zero_group_frac"].item() == 0.0


def test_groups_are_independent_and_equal_rewards_give_exact_zero() -> None:
    # group 7: rewards all 0.1 (0.1 * 3 / 3 != 0.1 in floating point, yet the advantage is exactly 0)
    # group 3: rewards 1, 0 -> +-0.5
    rewards = torch.tensor([0.1, 1.0, 0.1, 0.0, 0.1])
    groups = torch.tensor([7, 3, 7, 3, 7])
    adv, stats = rolewise_advantages(rewards, groups, present(*[(1, 1)] * 5))
    assert torch.equal(adv[[0, 2, 4]], torch.zeros(3, 3))
    torch.testing.assert_close(adv[[1, 3], ACT], torch.tensor([0.5, -0.5]))
    assert stats["adv/zero_group_frac"].item() == 0.5  # 1 of 2 groups
    # group stds: 0 and 0.5 -> mean 0.25
    assert stats["reward/group_std"].item() == pytest.approx(0.25)


def test_masked_episode_changes_nothing_and_gets_zero() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.2])
    groups = torch.zeros(3, dtype=torch.long)
    roles = present((1, 1), (1, 1), (1, 0))
    base, _ = rolewise_advantages(rewards, groups, roles)
    # a 4th episode whose reward could not be computed (None -> NaN), and a 5th flagged invalid
    rewards5 = torch.tensor([1.0, 0.0, 0.2, float("nan"), 5.0])
    valid5 = torch.tensor([True, True, True, True, False])
    adv, stats = rolewise_advantages(
        rewards5, torch.zeros(5, dtype=torch.long), present((1, 1), (1, 1), (1, 0), (1, 1), (1, 1)), valid5
    )
    torch.testing.assert_close(adv[:3], base)
    assert torch.equal(adv[3:], torch.zeros(2, 3))
    assert stats["reward/valid_frac"].item() == pytest.approx(3 / 5)


def test_by_invocation_weights_episodes_by_their_calls() -> None:
    # rewards 1, 0; episode 0 rehearsed 3 tool responses, episode 1 rehearsed 1
    rewards = torch.tensor([1.0, 0.0])
    counts = torch.tensor([[0, 2, 3], [0, 1, 1]])
    roles = counts > 0
    adv, _ = rolewise_advantages(rewards, torch.zeros(2, dtype=torch.long), roles, by="invocation", role_counts=counts)
    # rehearse rows: 1, 1, 1, 0 -> baseline 3/4 -> adv 0.25, -0.75
    torch.testing.assert_close(adv[:, REH], torch.tensor([0.25, -0.75]))
    # act rows: 1, 1, 0 -> baseline 2/3 -> adv 1/3, -2/3
    torch.testing.assert_close(adv[:, ACT], torch.tensor([1 / 3, -2 / 3]))
    ep, _ = rolewise_advantages(rewards, torch.zeros(2, dtype=torch.long), roles, by="episode")
    torch.testing.assert_close(ep[:, REH], torch.tensor([0.5, -0.5]))  # per episode: baseline 0.5
    with pytest.raises(ValueError, match="role_counts"):
        rolewise_advantages(rewards, torch.zeros(2, dtype=torch.long), roles, by="invocation")


def test_scale_std() -> None:
    # rewards 1, 0, 0, 0: mean 0.25, population std sqrt(0.1875) = 0.4330
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    adv, _ = rolewise_advantages(
        rewards, torch.zeros(4, dtype=torch.long), present(*[(1, 1)] * 4), scale_std=True, eps=0.0
    )
    torch.testing.assert_close(adv[:, ACT], torch.tensor([0.75, -0.25, -0.25, -0.25]) / math.sqrt(0.1875))


def test_role_presence_counts_spans_and_token_advantages() -> None:
    roles = torch.tensor([[CTX, ACT, ACT, CTX, REH, REH, CTX, ACT, CTX, REH]])
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 1, 0, 0]])  # last rehearse token not sampled
    pres, counts = role_presence(roles, mask)
    assert counts.tolist() == [[0, 2, 1]] and pres.tolist() == [[False, True, True]]
    tok = token_advantages(torch.tensor([[9.0, 0.5, -2.0]]), roles)
    assert tok.tolist() == [[0.0, 0.5, 0.5, 0.0, -2.0, -2.0, 0.0, 0.5, 0.0, -2.0]]


# --- clipped surrogate -------------------------------------------------------------------------


def _tokens() -> dict[str, torch.Tensor]:
    """Two episodes of 5 tokens: [ctx, act, act, reh, pad] and [ctx, act, reh, reh, ctx]."""
    roles = torch.tensor([[CTX, ACT, ACT, REH, CTX], [CTX, ACT, REH, REH, CTX]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 1, 0]])
    logp = torch.tensor([[-9.0, -1.0, -2.0, -0.5, -7.0], [-3.0, -0.7, -1.5, -0.2, -4.0]])
    return {"roles": roles, "loss_mask": mask, "logprobs": logp}


def test_ratio_one_equals_plain_policy_gradient_in_value_and_gradient() -> None:
    t = _tokens()
    adv = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0], [0.0, -0.5, -0.5, -0.5, 0.0]])
    logp = t["logprobs"].clone().requires_grad_()
    loss, stats = clipped_surrogate(logp, logp.detach(), adv, t["roles"], t["loss_mask"])
    # ratio = 1 everywhere: loss = -(1 + 1 + 1 - 0.5 - 0.5 - 0.5) / 6 = -0.25
    assert loss.item() == pytest.approx(-0.25)
    loss.backward()
    ref = t["logprobs"].clone().requires_grad_()
    m = t["loss_mask"].float()
    pg = -(adv * ref * m).sum() / m.sum()  # REINFORCE: -mean(A * logp) over the 6 sampled tokens
    pg.backward()
    torch.testing.assert_close(logp.grad, ref.grad)
    assert stats["clip_frac"].item() == 0.0 and stats["ratio_mean"].item() == pytest.approx(1.0)
    assert stats["tokens/act"].item() == 3 and stats["tokens/rehearse"].item() == 3


def test_clipping_cases() -> None:
    # four act tokens, eps_low 0.2, eps_high 0.3 -> ratio clipped to [0.8, 1.3]
    roles = torch.full((1, 4), ACT)
    mask = torch.ones(1, 4)
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    logp = ratio.log().requires_grad_()
    loss, stats = clipped_surrogate(logp, torch.zeros(1, 4), adv, roles, mask, clip_eps=0.2, clip_eps_high=0.3)
    # token 0: A>0, ratio 1.5 > 1.3 -> min(1.5, 1.3) = 1.3, clipped (no gradient)
    # token 1: A<0, ratio 1.5      -> min(-1.5, -1.3) = -1.5, unclipped (gradient)
    # token 2: A>0, ratio 0.5      -> min(0.5, 0.8) = 0.5, unclipped (gradient)
    # token 3: A<0, ratio 0.5 < .8 -> min(-0.5, -0.8) = -0.8, clipped (no gradient)
    # loss = -(1.3 - 1.5 + 0.5 - 0.8) / 4 = 0.125
    assert loss.item() == pytest.approx(0.125)
    assert stats["clip_frac"].item() == 0.5
    loss.backward()
    # d/dlogp of -ratio*A/4 = -ratio*A/4: token 1: 1.5/4, token 2: -0.5/4
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.375, -0.125, 0.0]]))


def test_k3_kl_value() -> None:
    # one act token, ratio 1, advantage 0: loss = beta * k3 only
    # logp = -1, ref = -2 -> d = ref - logp = -1 -> k3 = e^-1 + 1 - 1 = 0.367879
    roles, mask = torch.tensor([[CTX, ACT]]), torch.tensor([[0, 1]])
    logp = torch.tensor([[-5.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -2.0]])
    loss, stats = clipped_surrogate(logp, logp.detach(), torch.zeros(1, 2), roles, mask, ref_logprobs=ref, kl_coef=0.1)
    assert stats["kl"].item() == pytest.approx(math.exp(-1))
    assert loss.item() == pytest.approx(0.1 * math.exp(-1))
    loss.backward()
    # d k3 / d logp = -e^d + 1 = 1 - e^-1
    assert logp.grad[0, 1].item() == pytest.approx(0.1 * (1 - math.exp(-1)))
    assert logp.grad[0, 0].item() == 0.0
    with pytest.raises(ValueError, match="ref_logprobs"):
        clipped_surrogate(logp, logp.detach(), torch.zeros(1, 2), roles, mask, kl_coef=0.1)


@pytest.mark.parametrize("zero_role", ["act", "rehearse"])
def test_zero_role_weight_gives_exactly_zero_gradient(zero_role: str) -> None:
    t = _tokens()
    rid = ACT if zero_role == "act" else REH
    logp = t["logprobs"].clone()
    logp[t["roles"] == rid] = -1e4  # extreme values must not leak NaN/inf through the masked branch
    logp.requires_grad_()
    old = torch.full_like(logp, -1.0)
    adv = torch.full_like(logp, 0.7)
    weights = {"act": 1.0, "rehearse": 1.0, zero_role: 0.0}
    loss, stats = clipped_surrogate(
        logp, old, adv, t["roles"], t["loss_mask"], weights, kl_coef=0.05, ref_logprobs=torch.full_like(logp, -2.0)
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(logp.grad[t["roles"] == rid] == 0)
    assert torch.all(logp.grad[t["roles"] == CTX] == 0)
    other = (t["roles"] != rid) & (t["roles"] != CTX)
    assert torch.all(logp.grad[other] != 0)
    # the denominator counts only the 3 weighted tokens: loss equals the mean over them alone
    keep = t["loss_mask"].bool() & other
    alone, _ = clipped_surrogate(
        logp.detach(), old, adv, t["roles"], keep, kl_coef=0.05, ref_logprobs=torch.full_like(logp, -2.0)
    )
    assert loss.item() == pytest.approx(alone.item())


def _batch(extra: bool = False) -> LossInputs:
    """Group 0: two episodes; group 1: two episodes; optionally a 5th, masked episode in group 0."""
    roles = torch.tensor([[CTX, ACT, REH, ACT], [CTX, ACT, REH, ACT], [CTX, ACT, ACT, CTX], [CTX, ACT, REH, ACT]])
    logp = torch.tensor(
        [[-1.0, -0.5, -0.6, -0.7], [-1.0, -0.4, -0.9, -0.3], [-1.0, -1.1, -0.2, -5.0], [-1.0, -0.3, -0.8, -0.6]]
    )
    old = logp - torch.tensor([0.0, 0.1, -0.05, 0.3])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25])
    groups = torch.tensor([0, 0, 1, 1])
    if extra:
        roles = torch.cat([roles, torch.tensor([[CTX, ACT, REH, ACT]])])
        logp = torch.cat([logp, torch.tensor([[-1.0, -3.0, -0.1, -2.0]])])
        old = torch.cat([old, torch.tensor([[-1.0, -1.0, -1.0, -1.0]])])
        rewards = torch.cat([rewards, torch.tensor([float("nan")])])
        groups = torch.cat([groups, torch.tensor([0])])
    mask = (roles > 0).float()
    mask[2, 3] = 0  # padding
    return LossInputs(logp.requires_grad_(), old, roles, mask, rewards, groups)


def test_role_grpo_loss_masked_episode_leaves_loss_identical() -> None:
    loss_fn = RoleGRPOLoss(clip_eps=0.2, clip_eps_high=0.28)
    b4, b5 = _batch(), _batch(extra=True)
    l4, s4 = loss_fn(b4)
    l5, s5 = loss_fn(b5._asdict())  # a mapping works too
    torch.testing.assert_close(l5, l4)  # same up to float32 summation order
    l4.backward()
    l5.backward()
    torch.testing.assert_close(b5.logprobs.grad[:4], b4.logprobs.grad)
    assert torch.all(b5.logprobs.grad[4] == 0)
    assert s4["tokens/act"] == s5["tokens/act"] and s5["reward/valid_frac"].item() == pytest.approx(0.8)


@pytest.mark.parametrize("adv_by", ["episode", "invocation"])
def test_role_grpo_loss_matches_hand_computation(adv_by: str) -> None:
    # kl off, no clipping; hand-compute -sum(ratio * A) / N
    loss_fn = RoleGRPOLoss(clip_eps=10.0, adv_by=adv_by)
    b = _batch()
    loss, stats = loss_fn(b)
    # group 0: rewards 1, 0; both episodes have 2 act spans and 1 rehearse span, so either way
    #          act/rehearse advantages are +0.5, -0.5
    # group 1: rehearse set = {episode 3} alone -> flat -> 0. Act:
    #   by episode:    baseline (0.5 + 0.25) / 2 = 0.375      -> +0.125, -0.125
    #   by invocation: episode 2 has 1 act span (its 2nd act token is padding), episode 3 has 2
    #                  baseline (0.5 * 1 + 0.25 * 2) / 3 = 1/3  -> +1/6, -1/12
    a2, a3 = (0.125, -0.125) if adv_by == "episode" else (1 / 6, -1 / 12)
    adv = torch.tensor([[0, 0.5, 0.5, 0.5], [0, -0.5, -0.5, -0.5], [0, a2, a2, 0], [0, a3, 0, a3]])
    ratio = torch.exp(b.logprobs.detach() - b.old_logprobs)
    n = b.loss_mask.sum()  # 3 + 3 + 2 + 3 = 11 sampled tokens
    assert n.item() == 11
    expected = -(ratio * adv * b.loss_mask).sum() / n
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert stats["adv/zero_group_frac"].item() == 0.0


def test_bad_hyperparameters_raise() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        RoleGRPOLoss(role_weights={"caller": 1.0})
    with pytest.raises(ValueError, match="episode"):
        rolewise_advantages(
            torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool), by="row"
        )
