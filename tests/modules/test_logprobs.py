"""Loss-side log-probs: computed only where the loss needs them, and with a group's shared prefix
run once — same values and gradients as the plain forward."""

from __future__ import annotations

import pytest
import torch

from envace.data.batch import TokenBatch
from envace.modules.logprobs import (
    backward_in_chunks,
    chunked_logprobs,
    prefix_shared_logprobs,
    row_chunks,
    selected_logprobs,
    shared_prefix_length,
)
from envace.policy import LoraSpec, PolicySpec, load_model


def _batch(prefix: int = 80, lengths=(30, 50, 20)) -> TokenBatch:
    torch.manual_seed(0)
    pre = torch.randint(10, 1000, (prefix,))
    rows = [torch.cat([pre, torch.randint(10, 1000, (n,))]) for n in lengths]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    loss = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attn[i, : len(r)], loss[i, prefix + 5 : len(r)] = r, 1, 1
    return TokenBatch(ids, attn, loss.long(), loss, torch.zeros_like(loss))


def _model():
    model = load_model(PolicySpec("tiny", lora=LoraSpec(r=4)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model


def test_selected_logprobs_equal_a_full_log_softmax() -> None:
    model, batch = _model(), _batch()
    with torch.no_grad():
        full = torch.log_softmax(model(batch.input_ids, attention_mask=batch.attention_mask).logits.float(), -1)
    expected = full[:, :-1].gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    got = selected_logprobs(model, batch)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(got[:, 1:][mask[:, 1:]], expected[mask[:, 1:]], atol=1e-5, rtol=0)
    unused = ~mask.any(dim=0)  # positions no row needs never reach the LM head
    assert (got[:, unused] == 0).all()


def test_shared_prefix_gives_the_same_values_and_gradients() -> None:
    model, batch = _model(), _batch()
    assert shared_prefix_length(batch, minimum=16) == 80
    mask = batch.loss_mask
    plain = selected_logprobs(model, batch)
    (plain * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    shared = prefix_shared_logprobs(model, batch, 80)
    (shared * mask).sum().backward()
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=0)
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, grads[name], atol=1e-4, rtol=1e-4)


def test_no_shared_prefix_when_rows_differ_early() -> None:
    batch = _batch()
    batch.input_ids[1, 3] += 1
    assert shared_prefix_length(batch, minimum=16) == 0


def _shared_or_plain(model):
    def fn(batch: TokenBatch) -> torch.Tensor:
        prefix = shared_prefix_length(batch, minimum=16)
        return prefix_shared_logprobs(model, batch, prefix) if prefix else selected_logprobs(model, batch)

    return fn


def test_row_chunks_keep_every_chunk_within_the_budget() -> None:
    batch = _batch(lengths=(30, 50, 20, 60, 5))  # rows of 110, 130, 100, 140, 85 tokens
    chunks = row_chunks(batch, 300)
    assert [(c.start, c.stop) for c in chunks] == [(0, 2), (2, 4), (4, 5)]  # 2 x 130, 2 x 140, 85
    assert row_chunks(batch, 10) == [slice(i, i + 1) for i in range(5)]  # a row longer than the budget: alone
    assert row_chunks(batch, 10_000) == [slice(0, 5)]
    # the 80-token prefix every row shares is run once per chunk: 80 + 3 x 50 = 230 fit in 300
    shared = row_chunks(batch, 300, lambda b: shared_prefix_length(b, minimum=16))
    assert [(c.start, c.stop) for c in shared] == [(0, 3), (3, 5)]


def _grpo_loss_of(batch: TokenBatch):
    from envace.losses import LossInputs, RoleGRPOLoss

    rows = batch.input_ids.shape[0]
    inputs = LossInputs(
        logprobs=batch.logprobs,
        old_logprobs=batch.logprobs,
        roles=batch.roles,
        loss_mask=batch.loss_mask,
        rewards=torch.arange(rows, dtype=torch.float32) % 3,
        group_ids=torch.arange(rows) // 2,
    )
    return lambda lp: RoleGRPOLoss()(inputs._replace(logprobs=lp))


def _sft_loss_of(batch: TokenBatch):
    from envace.losses import RoleNLLLoss

    return lambda lp: RoleNLLLoss()({"logprobs": lp, "roles": batch.roles, "loss_mask": batch.loss_mask})


@pytest.mark.parametrize("loss", ["grpo", "sft"])
def test_backward_in_chunks_gives_the_whole_batch_gradient(loss: str) -> None:
    model, batch = _model(), _batch(lengths=(30, 50, 20, 60))
    with torch.no_grad():  # sampling log-probs a little off the policy's: ratios differ from 1
        batch = batch._replace(logprobs=(selected_logprobs(model, batch) - 0.1) * batch.loss_mask)
    loss_of = (_grpo_loss_of if loss == "grpo" else _sft_loss_of)(batch)
    fn = _shared_or_plain(model)
    want, want_stats = loss_of(fn(batch))
    want.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    got, stats = backward_in_chunks(fn, batch, loss_of, 300)  # three chunks, each trimmed to its longest row
    torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)
    assert stats.keys() == want_stats.keys()
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4)


def test_chunked_logprobs_give_the_same_values() -> None:
    model, batch = _model(), _batch(lengths=(30, 50, 20, 60))
    fn = _shared_or_plain(model)
    mask = batch.loss_mask
    with torch.no_grad():
        whole, chunked = fn(batch), chunked_logprobs(fn, batch, 300)
    assert chunked.shape == whole.shape
    torch.testing.assert_close(chunked * mask, whole * mask, atol=1e-5, rtol=0)  # elsewhere: padding, unused


def test_backward_in_chunks_holds_one_chunk_of_activations() -> None:
    """Memory held between a forward and its backward (saved-tensor hooks): with chunks, at most one
    chunk's activations at a time."""
    model, batch = _model(), _batch(lengths=(300, 280, 320, 310))
    fn, loss_of = _shared_or_plain(model), _sft_loss_of(batch)
    live, peak = 0, 0

    def pack(t: torch.Tensor) -> tuple[torch.Tensor, int]:
        nonlocal live, peak
        live += t.numel() * t.element_size()
        peak = max(peak, live)
        return t, t.numel() * t.element_size()

    def unpack(saved: tuple[torch.Tensor, int]) -> torch.Tensor:
        return saved[0]

    def backward(loss: torch.Tensor) -> None:
        nonlocal live
        loss.backward()
        live = 0  # the graph is freed with its backward

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        backward_in_chunks(fn, batch, loss_of, None, backward)
        whole, peak = peak, 0
        backward_in_chunks(fn, batch, loss_of, 400, backward)  # one row a chunk
    assert peak < whole / 3


def test_still_rows_run_without_backward_and_change_neither_gradient_nor_stats() -> None:
    """A GRPO group without reward variance (no KL term) has an exactly zero gradient: the update runs
    its rows forward without autograd and takes no backward on them, and the step's gradient, loss and
    every stat are the whole batch's."""
    from envace.losses import LossInputs, RoleGRPOLoss

    model, batch = _model(), _batch(lengths=(30, 50, 20, 60, 40, 35))
    with torch.no_grad():
        batch = batch._replace(logprobs=(selected_logprobs(model, batch) - 0.1) * batch.loss_mask)
    inputs = LossInputs(logprobs=batch.logprobs, old_logprobs=batch.logprobs, roles=batch.roles,
                        loss_mask=batch.loss_mask, rewards=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]),
                        group_ids=torch.arange(6) // 2)  # fmt: skip
    grpo = RoleGRPOLoss()
    still = grpo.still_rows(inputs)
    assert still.tolist() == [False, False, True, True, True, True]  # groups 1 and 2 are flat

    def loss_of(lp: torch.Tensor):
        return grpo(inputs._replace(logprobs=lp))

    fn = _shared_or_plain(model)
    want, want_stats = loss_of(fn(batch))
    want.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    with_grad = []

    def counting(b: TokenBatch) -> torch.Tensor:
        with_grad.append(torch.is_grad_enabled())
        return fn(b)

    got, stats = backward_in_chunks(counting, batch, loss_of, 300, still=still)
    assert with_grad.count(True) >= 1 and with_grad.count(False) >= 1
    torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)
    for key, value in want_stats.items():
        torch.testing.assert_close(stats[key], value.detach(), atol=1e-5, rtol=1e-4)
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4)

    assert not RoleGRPOLoss(kl_coef=0.05).still_rows(inputs).any()  # a KL term moves every row
    masked = inputs._replace(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, float("nan"), 1.0]))
    assert grpo.still_rows(masked).tolist() == [False, False, False, False, True, True]  # one valid: flat
