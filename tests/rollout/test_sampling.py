"""The engine's draw, apart from any model: temperature, top-k, top-p, and each row's own stream.

The logits are ``log([1, 2, 5])`` throughout: probabilities ``[1/8, 2/8, 5/8]``, CDF ``[1/8, 3/8, 1]``.
"""

from __future__ import annotations

import math

import torch

from envace.rollout.engine import SamplingConfig, draw

LOGITS = torch.tensor([[1.0, 2.0, 5.0]]).log()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tokens(sampling: SamplingConfig, seeds: range) -> list[int]:
    """One row per seed, each drawing from its own generator."""
    logits = LOGITS.expand(len(seeds), -1)
    token, _ = draw(logits, sampling, [_gen(s) for s in seeds])
    return token.tolist()


def test_greedy_is_the_argmax_with_its_temperature_one_logprob() -> None:
    logits = torch.tensor([[0.3, 2.0, -1.0], [4.0, 1.0, 3.9]])
    token, logprob = draw(logits, SamplingConfig(temperature=0.0), [_gen(0), _gen(1)])
    assert token.tolist() == [1, 0]
    torch.testing.assert_close(logprob, torch.log_softmax(logits, dim=-1)[[0, 1], [1, 0]], rtol=0, atol=0)
    token, logprob = draw(LOGITS, SamplingConfig(temperature=0.0))
    assert token.tolist() == [2]
    torch.testing.assert_close(logprob, torch.tensor([math.log(5 / 8)]), rtol=0, atol=1e-6)


def test_the_token_is_the_inverse_cdf_of_the_rows_uniform() -> None:
    for seed in range(20):
        u = float(torch.rand(1, generator=_gen(seed)))
        want = 0 if u <= 1 / 8 else 1 if u <= 3 / 8 else 2  # the first index whose CDF reaches u
        token, logprob = draw(LOGITS, SamplingConfig(), [_gen(seed)])
        assert token.tolist() == [want]
        torch.testing.assert_close(logprob, torch.tensor([math.log([1, 2, 5][want] / 8)]), rtol=0, atol=1e-6)


def test_the_drawn_frequencies_follow_the_distribution() -> None:
    torch.manual_seed(0)  # no generators: every row draws from the global stream
    token, _ = draw(LOGITS.expand(4000, -1), SamplingConfig())
    freq = torch.bincount(token, minlength=3).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([1 / 8, 2 / 8, 5 / 8]), rtol=0, atol=0.03)  # ~4 standard errors


def test_a_rows_draw_depends_only_on_its_own_generator() -> None:
    sampling = SamplingConfig()
    logits = torch.randn(3, 50, generator=_gen(7))
    together, lp_together = draw(logits, sampling, [_gen(1), _gen(2), _gen(3)])
    for row, seed in enumerate((1, 2, 3)):
        alone, lp_alone = draw(logits[row : row + 1], sampling, [_gen(seed)])
        assert alone.item() == together[row].item()
        assert lp_alone.item() == lp_together[row].item()
    others = draw(logits, sampling, [_gen(11), _gen(2), _gen(13)])[0]  # the neighbours' streams change
    assert others[1] == together[1]
    torch.manual_seed(0)  # the global stream is left alone when every row has its own
    draw(logits, sampling, [_gen(1), _gen(2), _gen(3)])
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(1))


def test_top_k_one_is_the_argmax_but_the_logprob_is_the_full_distributions() -> None:
    token, logprob = draw(LOGITS.expand(16, -1), SamplingConfig(top_k=1), [_gen(s) for s in range(16)])
    assert set(token.tolist()) == {2}
    # top-k chooses the token; the recorded log-prob is of the untruncated distribution (as the loss sees it)
    torch.testing.assert_close(logprob, torch.full((16,), math.log(5 / 8)), rtol=0, atol=1e-6)


def test_top_k_two_never_draws_the_third() -> None:
    assert set(_tokens(SamplingConfig(top_k=2), range(200))) == {1, 2}


def test_top_p_drops_the_tail_and_keeps_at_least_the_most_likely_token() -> None:
    # top_p 0.7: the ascending CDF [1/8, 3/8, 1] drops what lies within the lowest 0.3 mass, the 1/8 token only
    assert set(_tokens(SamplingConfig(top_p=0.7), range(200))) == {1, 2}
    # a nucleus smaller than any token, even of no mass: still the most likely one
    assert set(_tokens(SamplingConfig(top_p=1e-6), range(50))) == {2}
    first = torch.tensor([[5.0, 2.0, 1.0]]).log()  # the most likely token first, where no clamp lands
    token, _ = draw(first.expand(50, -1), SamplingConfig(top_p=0.0), [_gen(s) for s in range(50)])
    assert set(token.tolist()) == {0}


def test_the_logprob_is_the_temperature_scaled_one() -> None:
    # at temperature 2, logits 2 * log([1, 2, 5]) are the distribution [1/8, 2/8, 5/8]
    token, logprob = draw(2 * LOGITS.expand(32, -1), SamplingConfig(temperature=2.0), [_gen(s) for s in range(32)])
    want = torch.tensor([1.0, 2.0, 5.0]).div(8).log()[token]
    torch.testing.assert_close(logprob, want, rtol=0, atol=1e-6)
    assert len(set(token.tolist())) == 3  # a sample, not the argmax
    # at temperature 1 the same logits are the sharper [1/30, 4/30, 25/30], and the log-probs are those
    token, logprob = draw(2 * LOGITS.expand(32, -1), SamplingConfig(temperature=1.0), [_gen(s) for s in range(32)])
    torch.testing.assert_close(logprob, torch.tensor([1.0, 4.0, 25.0]).div(30).log()[token], rtol=0, atol=1e-6)
