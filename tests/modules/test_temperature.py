"""The RL loss takes its log-probs at the temperature the episodes were sampled at: on the first
(on-policy) update the importance ratio is 1, at T = 0.7 as at T = 1."""

from __future__ import annotations

import pytest
import torch

from envace.data.batch import collate_episodes
from envace.data.sources import load_source
from envace.losses.sft import gather_logprobs
from envace.modules import EnvACEModule
from envace.policy import PolicySpec
from envace.rollout import PolicyRehearsal, RolloutLimits, SamplingConfig


def test_gather_logprobs_at_a_temperature_matches_autograd() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5))
    ours = gather_logprobs(logits, labels, chunk_size=2, temperature=0.7)
    ref = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, ref)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g_ours, g_ref)
    with pytest.raises(ValueError, match="temperature must be positive"):
        gather_logprobs(logits, labels, temperature=0.0)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_first_update_ratio_is_one_at_the_sampling_temperature(temperature: float) -> None:
    torch.manual_seed(0)
    sampling = SamplingConfig(temperature=temperature)
    limits = RolloutLimits(max_steps_per_turn=1, max_new_tokens=12)
    module = EnvACEModule(policy=PolicySpec("tiny"), tool_style="compact", sampling=sampling, limits=limits)
    module.configure_model()
    tasks = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])[:1]
    episodes = module.run_episodes([t.first_turns(1) for t in tasks], 2, PolicyRehearsal()).episodes
    tokens = collate_episodes([e.tensors() for e in episodes], module.engine.pad_id)
    sampled = tokens.loss_mask.bool() & (tokens.roles > 0)
    assert sampled.sum() >= 12  # the episodes sampled tokens to compare
    with torch.no_grad():
        new = module.token_logprobs(tokens, module.loss_temperature)
        at_one = module.token_logprobs(tokens, 1.0)
    ratio = (new - tokens.logprobs)[sampled].exp()
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=2e-4, rtol=0)
    if temperature != 1.0:  # the loss at T = 1 would see a ratio far from 1: the bias this fixes
        assert (at_one - tokens.logprobs)[sampled].abs().max() > 0.05
