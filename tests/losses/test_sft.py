"""Warm-start NLL and the chunked log-prob gather."""

from __future__ import annotations

import math

import pytest
import torch

from envace.losses import RoleNLLLoss, gather_logprobs, role_weighted_nll

CTX, ACT, REH = 0, 1, 2


def test_role_weighted_nll_hand_example() -> None:
    roles = torch.tensor([[CTX, ACT, ACT, REH, REH]])
    mask = torch.tensor([[0, 1, 1, 1, 0]])  # last rehearse token is padding
    logp = torch.tensor([[-9.0, -1.0, -2.0, -4.0, -100.0]], requires_grad=True)
    loss, stats = role_weighted_nll(logp, roles, mask, {"act": 1.0, "rehearse": 0.5})
    # sum w * nll = 1 + 2 + 0.5 * 4 = 5 over N = 3 weighted tokens
    assert loss.item() == pytest.approx(5 / 3)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1 / 3, -1 / 3, -0.5 / 3, 0.0]]))
    assert stats["nll/act"].item() == pytest.approx(1.5) and stats["nll/rehearse"].item() == pytest.approx(4.0)
    assert stats["tokens/act"].item() == 2 and stats["tokens/rehearse"].item() == 1


def test_zero_weight_role_gets_no_gradient_and_leaves_denominator() -> None:
    roles = torch.tensor([[ACT, REH, REH]])
    logp = torch.tensor([[-1.0, -float("inf"), -3.0]], requires_grad=True)
    loss, _ = RoleNLLLoss({"act": 1.0, "rehearse": 0.0})(
        {"logprobs": logp, "roles": roles, "loss_mask": torch.ones(1, 3)}
    )
    assert loss.item() == pytest.approx(1.0)  # only the act token, N = 1
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, 0.0, 0.0]]


def test_empty_batch_gives_zero_loss() -> None:
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, _ = role_weighted_nll(logp, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.all(logp.grad == 0)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_gather_logprobs_equals_naive(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=g, dtype=torch.float64).float().requires_grad_()
    labels = torch.randint(0, 11, (2, 7), generator=g)
    out = gather_logprobs(logits, labels, chunk_size=chunk)
    naive_logits = logits.detach().clone().requires_grad_()
    naive = torch.log_softmax(naive_logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(out, naive)
    weights = torch.randn(2, 7, generator=g)
    (out * weights).sum().backward()
    (naive * weights).sum().backward()
    torch.testing.assert_close(logits.grad, naive_logits.grad)


def test_gather_logprobs_hand_value() -> None:
    # logits [0, ln 3] -> softmax [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert gather_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))


def test_gather_logprobs_bf16_keeps_no_full_fp32_copy() -> None:
    b, t, v, chunk = 2, 64, 512, 16
    logits = torch.randn(b, t, v).bfloat16().requires_grad_()
    labels = torch.randint(0, v, (b, t))
    saved: list[int] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        view = x.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
        saved.append(0 if view else x.numel() * x.element_size())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = gather_logprobs(logits, labels, chunk_size=chunk)
    full_fp32 = b * t * v * 4
    # only views of the logits, labels and [B, chunk] results are kept, far below one fp32 copy
    assert sum(saved) < full_fp32 / 8
    out.sum().backward()
    naive = torch.log_softmax(logits.detach().float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(out, naive)
    assert logits.grad is not None and logits.grad.shape == logits.shape


def test_gather_logprobs_bf16_gradient_is_the_float_one_rounded() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 9, 300, generator=g).bfloat16().requires_grad_()
    labels = torch.randint(0, 300, (2, 9), generator=g)
    weights = torch.randn(2, 9, generator=g)
    (gather_logprobs(logits, labels, chunk_size=4) * weights).sum().backward()
    ref = logits.detach().float().requires_grad_()
    (torch.log_softmax(ref, -1).gather(-1, labels[..., None]).squeeze(-1) * weights).sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    # computed in fp32 and rounded once: within one bf16 step (2^-8 relative) of the float gradient
    torch.testing.assert_close(logits.grad.float(), ref.grad, rtol=2**-8, atol=1e-7)


def test_gather_logprobs_rejects_ignore_index() -> None:
    with pytest.raises(ValueError, match="negative"):
        gather_logprobs(torch.zeros(1, 2, 3), torch.tensor([[0, -100]]))
