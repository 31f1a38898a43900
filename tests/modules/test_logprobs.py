"""Loss-side log-probs: computed only where the loss needs them, and with a group's shared prefix
run once — same values and gradients as the plain forward."""

from __future__ import annotations

import torch

from envace.data.batch import TokenBatch
from envace.modules.base import prefix_shared_logprobs, selected_logprobs, shared_prefix_length
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
