"""The generation engine's caches: a row's keys and values are reused by its next call, new ones are
written in place, and sampled log-probs still match a fresh forward of the whole sequence."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from envace.policy import LoraSpec, apply_lora
from envace.rollout import GenerationEngine, SamplingConfig
from envace.rollout.engine import GrowingLayer, PackedLinear, Request


def _fresh_logprobs(model, ids: list[int], n: int) -> torch.Tensor:
    """Log-probs of the last ``n`` tokens of ``ids`` from one unpadded, uncached forward."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    return lp[-n:]


def test_growing_layer_equals_concatenation() -> None:
    torch.manual_seed(0)
    grow, plain = GrowingLayer(capacity=4), DynamicLayer()
    for n in (3, 1, 1, 5, 1):  # the fourth write overflows the capacity: the storage grows
        k, v = torch.randn(2, 3, n, 8), torch.randn(2, 3, n, 8)
        for got, want in zip(grow.update(k, v), plain.update(k, v), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert grow.get_seq_length() == 11
    grow.crop(-2)  # another method replaces the view: the next write adopts it
    plain.crop(-2)
    k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
    torch.testing.assert_close(grow.update(k, v)[0], plain.update(k, v)[0], rtol=0, atol=0)


def test_growing_layer_rows_join_widen_and_leave() -> None:
    torch.manual_seed(0)
    layer = GrowingLayer(capacity=6)
    rows = [torch.randn(3, 4, 8) for _ in range(2)]  # [heads, tokens, dim]: two rows of 4 tokens
    layer.update(torch.stack(rows), torch.stack(rows))
    joiner = torch.randn(3, 7, 8)  # longer than the batch: the view widens by 3 zero columns
    layer.widen(3)
    layer.put(2, joiner, -joiner)  # a new slot: the storage grows a row
    assert layer.keys.shape == (3, 3, 7, 8) and layer.get_seq_length() == 7
    torch.testing.assert_close(layer.keys[2], joiner, rtol=0, atol=0)
    torch.testing.assert_close(layer.values[2], -joiner, rtol=0, atol=0)
    torch.testing.assert_close(layer.keys[0, :, 3:], rows[0], rtol=0, atol=0)
    assert not layer.keys[:2, :, :3].any()  # the new columns are zero (masked, finite)
    step = torch.randn(3, 3, 1, 8)  # a decoding step writes one column for every row, past the capacity
    layer.update(step, step)
    torch.testing.assert_close(layer.keys[:, :, -1:], step, rtol=0, atol=0)
    layer.put(0, rows[1], rows[1])  # a joiner in a freed slot, right-aligned
    torch.testing.assert_close(layer.keys[0, :, -4:], rows[1], rtol=0, atol=0)
    layer.batch_select_indices(torch.tensor([2, 0]))  # any order: a copy that keeps the rows' columns
    torch.testing.assert_close(layer.keys[0, :, :7], joiner, rtol=0, atol=0)
    torch.testing.assert_close(layer.keys[1, :, -4:], rows[1], rtol=0, atol=0)
    layer.put(2, joiner, joiner)
    layer.batch_select_indices(torch.tensor([0, 2]))  # increasing: row 2 moves down in place
    assert layer.keys.shape == (2, 3, 8, 8)
    torch.testing.assert_close(layer.keys[1, :, -7:], joiner, rtol=0, atol=0)


@pytest.mark.parametrize("reuse", [True, False])
def test_a_row_continues_from_its_kept_keys_and_values(tiny_model, reuse: bool) -> None:
    torch.manual_seed(0)
    sampling = SamplingConfig(min_prefix=8, reuse_rows=reuse)
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=sampling)  # never stops
    prefix = torch.randint(10, 1000, (40,)).tolist()
    prompts = [prefix + [5, 6, 7], prefix + [8, 9, 10, 11, 12]]
    first = engine.generate(prompts, 4)
    assert engine.stats.prefill_tokens == 40 + 3 + 5  # the shared prefix once, then each row's own part
    # row 0's next turn (its sample and three appended tokens), and a new row sharing only the prefix
    turn = [prompts[0] + first[0].ids + [11, 12, 13], prefix + [21, 22]]
    before = engine.stats.prefill_tokens
    samples = engine.generate(turn, 5)
    # with reuse, row 0 prefills its last sampled token and the three new ones; row 1 its two own
    assert engine.stats.prefill_tokens - before == (1 + 3 + 2 if reuse else len(turn[0]) - 40 + 2)
    for prompt, s in zip(turn, samples, strict=True):
        fresh = _fresh_logprobs(tiny_model, prompt + s.ids, len(s.ids))
        torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=1e-4, rtol=0)
    engine.reset_cache()
    assert not engine.kept.rows and not engine.kept.prefixes


def test_bfloat16_sampling_uses_a_copy_refreshed_after_each_update(tiny_model) -> None:
    torch.manual_seed(0)
    sampling = SamplingConfig(dtype="bfloat16", pack_weights=False)
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=sampling)
    prompt = torch.randint(10, 1000, (30,)).tolist()
    s = engine.generate([prompt], 6)[0]
    copy = engine.sampler()
    assert copy is not tiny_model and next(copy.parameters()).dtype == torch.bfloat16
    assert next(tiny_model.parameters()).dtype == torch.float32  # the policy itself is untouched
    # the recorded log-probs are the copy's (bf16 noise against the fp32 policy)
    bf16 = _fresh_logprobs(copy, prompt + s.ids, len(s.ids))
    torch.testing.assert_close(torch.tensor(s.logprobs), bf16, atol=0.05, rtol=0)
    torch.testing.assert_close(bf16, _fresh_logprobs(tiny_model, prompt + s.ids, len(s.ids)), atol=0.1, rtol=0)
    with torch.no_grad():
        tiny_model.lm_head.weight.mul_(2.0)  # an update
    engine.generate([prompt], 1)
    assert engine.sampler() is copy and not torch.equal(copy.lm_head.weight, tiny_model.lm_head.weight.bfloat16())
    engine.reset_cache()  # what the rollout does before sampling with new weights
    assert engine.sampler() is copy
    torch.testing.assert_close(copy.lm_head.weight, tiny_model.lm_head.weight.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("lora", "dtype"), [(False, None), (True, None), pytest.param(True, "bfloat16", marks=pytest.mark.bf16_prepack)]
)
def test_packed_sampling_matches_the_policy_and_follows_its_updates(tiny_model, lora: bool, dtype) -> None:
    torch.manual_seed(0)
    policy = apply_lora(tiny_model, LoraSpec(r=4, alpha=8, target_modules=("q_proj", "v_proj"))) if lora else tiny_model
    if lora:  # adapters that change the output (peft initialises B to zero)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    engine = GenerationEngine(policy, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(dtype=dtype))  # packs by default
    packed = engine.sampler()
    assert packed is not policy and isinstance(packed.lm_head, PackedLinear)
    tol = 1e-4 if dtype is None else 0.1  # a bf16 copy: bf16 noise against the fp32 policy
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())  # LoRA merged, every linear packed
    prompts = [torch.randint(10, 1000, (n,)).tolist() for n in (20, 27)]
    for prompt, s in zip(prompts, engine.generate(prompts, 6), strict=True):  # batched: rows padded
        fresh = _fresh_logprobs(policy, prompt + s.ids, len(s.ids))
        torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=tol, rtol=0)
    engine.reset_cache()
    assert engine.sampler() is packed  # the weights did not change: nothing rebuilt
    with torch.no_grad():  # an update of the trained weights
        next(p for p in policy.parameters() if p.requires_grad).mul_(1.5)
    engine.generate(prompts[:1], 1)
    assert engine.sampler() is packed  # within a rollout the copy stays as it was (its caches too)
    engine.reset_cache()
    assert engine.sampler() is not packed
    s = engine.generate(prompts[:1], 6)[0]
    fresh = _fresh_logprobs(policy, prompts[0] + s.ids, len(s.ids))
    torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=tol, rtol=0)


def test_packed_linear_equals_the_linear_for_any_row_count() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80)
    packed = PackedLinear(linear)
    for shape in ((1, 48), (2, 48), (3, 5, 48), (64, 48)):
        x = torch.randn(*shape)
        torch.testing.assert_close(packed(x), linear(x), atol=1e-5, rtol=1e-5)


def test_identical_prompts_are_prefilled_once_and_rows_sample_from_their_episodes_streams(tiny_model) -> None:
    torch.manual_seed(0)
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(min_prefix=8))
    prefix = torch.randint(10, 1000, (40,)).tolist()
    a, b = prefix + [5, 6, 7], prefix + [8, 9]
    prompts = [a, b, a, a]  # e.g. three members of a group that made the same call

    def rngs(*seeds: int) -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(s) for s in seeds]

    samples = engine.generate(prompts, 4, rngs(1, 2, 3, 4))
    assert engine.stats.prefill_tokens == 40 + 3 + 2  # the shared prefix, then a and b once each
    assert len({tuple(s.ids) for s in samples}) == 4  # the copies of a still sample on their own
    for prompt, s in zip(prompts, samples, strict=True):
        fresh = _fresh_logprobs(tiny_model, prompt + s.ids, len(s.ids))
        torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=1e-4, rtol=0)
    before = engine.stats.prefill_tokens  # each copy continues from its own kept keys and values
    engine.generate([a + samples[3].ids + [11]], 2)
    assert engine.stats.prefill_tokens - before == 2  # its last sampled token and the new one
    engine.reset_cache()
    alone = engine.generate([a], 4, rngs(3))[0]  # the same stream alone: the same tokens
    assert alone.ids == samples[2].ids
    each = GenerationEngine(tiny_model, [-1], 2, SamplingConfig(min_prefix=8, share_identical=False))
    assert [s.ids for s in each.generate(prompts, 4, rngs(1, 2, 3, 4))] == [s.ids for s in samples]
    assert each.stats.prefill_tokens == 40 + 3 + 2 + 3 + 3  # without sharing: every row its own part


def test_kept_rows_stay_within_their_token_budget(tiny_model) -> None:
    sampling = SamplingConfig(min_prefix=8, row_cache_tokens=50)
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=sampling)
    engine.generate([list(range(10, 50)), list(range(60, 100))], 4)  # two rows of 43 tokens each
    assert [len(k) for k in engine.kept.rows] == [43]  # the least recently kept one went


def test_stopped_rows_leave_the_batch_and_keep_their_keys_and_values(tiny_model) -> None:
    torch.manual_seed(1)
    engine = GenerationEngine(tiny_model, stop_ids=list(range(0, 49152, 3)), pad_id=2)  # a third of ids stop
    prompts = [torch.randint(10, 1000, (n,)).tolist() for n in (20, 25, 30, 35, 40, 45)]
    samples = engine.generate(prompts, 12)
    lengths = [len(s.ids) for s in samples]
    assert len(set(lengths)) > 2 and min(lengths) < 4  # rows stopped at different steps
    for prompt, s in zip(prompts, samples, strict=True):
        assert s.stopped == (s.ids[-1] % 3 == 0) and all(t % 3 for t in s.ids[:-1])
        fresh = _fresh_logprobs(tiny_model, prompt + s.ids, len(s.ids))
        torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=1e-4, rtol=0)
    # every row, also those that left the batch early, continues from its kept keys and values
    turn = [p + s.ids + [11, 12] for p, s in zip(prompts, samples, strict=True)]
    before = engine.stats.prefill_tokens
    for prompt, s in zip(turn, engine.generate(turn, 3), strict=True):
        fresh = _fresh_logprobs(tiny_model, prompt + s.ids, len(s.ids))
        torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=1e-4, rtol=0)
    assert engine.stats.prefill_tokens - before == 3 * len(turn)  # the last sampled token and two new ones


def test_sampling_ignores_the_callers_autocast(tiny_model) -> None:
    torch.manual_seed(0)
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2)
    prompt = torch.randint(10, 1000, (20,)).tolist()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as Lightning's bf16-mixed wraps training_step
        s = engine.generate([prompt], 5)[0]
    fresh = _fresh_logprobs(tiny_model, prompt + s.ids, len(s.ids))
    torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=1e-4, rtol=0)  # fp32, not bf16 noise


def test_temperature_zero_decodes_greedily_and_decoding_restores_the_temperature(tiny_model) -> None:
    torch.manual_seed(0)
    engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(temperature=1.0))
    prompt = torch.randint(10, 1000, (12,)).tolist()
    with engine.decoding(0.0):
        assert engine.sampling.temperature == 0.0
        a = engine.generate([prompt], 6)[0]
        engine.reset_cache()
        b = engine.generate([prompt, prompt], 6)
    assert engine.sampling.temperature == 1.0
    assert a.ids == b[0].ids == b[1].ids  # greedy: every row and every call writes the same tokens
    ids = prompt
    for token in a.ids:  # each token is the argmax of a fresh forward; its log-prob is at temperature 1
        with torch.no_grad():
            logits = tiny_model(torch.tensor([ids])).logits[0, -1].float()
        assert token == int(logits.argmax())
        ids = ids + [token]
    torch.testing.assert_close(
        torch.tensor(a.logprobs), _fresh_logprobs(tiny_model, ids, len(a.ids)), atol=1e-4, rtol=0
    )


def test_continuations_join_the_running_batch_and_sample_as_in_lockstep(tiny_model) -> None:
    """Rows 1-3 end early and ask for their next turn (their sample and two new tokens), twice, while
    row 0 runs 24 tokens: the turns join the batch row 0 decodes in (continuations longer than the
    batch widen it, free slots are reused), prefill only what is new, and sample what lockstep does."""
    torch.manual_seed(2)
    prompts = [torch.randint(10, 1000, (n,)).tolist() for n in (20, 30, 40, 50)]
    budgets = [24, 3, 5, 4]

    def run(continuous: bool) -> tuple[dict[tuple[int, int], tuple[list[int], Any]], GenerationEngine]:
        sampling = SamplingConfig(min_prefix=8, continuous=continuous)
        engine = GenerationEngine(tiny_model, stop_ids=[-1], pad_id=2, sampling=sampling)  # rows run their budget
        out: dict[tuple[int, int], tuple[list[int], Any]] = {}

        def follow(request: Request, sample: Any) -> list[Request]:
            row, turn = request.tag
            out[request.tag] = (request.prompt, sample)
            if row == 0 or turn == 2:
                return []
            return [Request(request.prompt + sample.ids + [11, 12], budgets[row], request.rng, (row, turn + 1))]

        rngs = [torch.Generator().manual_seed(row) for row in range(4)]
        engine.stream([Request(p, budgets[r], rngs[r], (r, 0)) for r, p in enumerate(prompts)], follow)
        return out, engine

    joined, engine = run(continuous=True)
    lockstep, other = run(continuous=False)
    assert len(joined) == 10
    assert {k: s.ids for k, (_, s) in joined.items()} == {k: s.ids for k, (_, s) in lockstep.items()}
    # lockstep: 24 steps, then 5, then 5; continuous: row 0's 24 steps, the turns' prefills among them
    assert other.stats.steps == 24 + 5 + 5 and engine.stats.steps < 24 + 6
    assert engine.stats.prefill_tokens == other.stats.prefill_tokens  # each turn prefilled its new tokens only
    for prompt, s in joined.values():
        fresh = _fresh_logprobs(tiny_model, prompt + s.ids, len(s.ids))
        torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=1e-4, rtol=0)


def test_micro_batches_sample_what_one_batch_samples(tiny_model) -> None:
    """More requests than ``batch_size``: the waiting ones take the slots that ending rows free."""
    torch.manual_seed(3)
    prompts = [torch.randint(10, 1000, (n,)).tolist() for n in (12, 20, 16, 30, 25)]

    def run(batch_size: int) -> list[list[int]]:
        sampling = SamplingConfig(min_prefix=8, batch_size=batch_size)
        engine = GenerationEngine(tiny_model, stop_ids=list(range(0, 49152, 5)), pad_id=2, sampling=sampling)
        rngs: list[torch.Generator | None] = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
        return [s.ids for s in engine.generate(prompts, 8, rngs)]

    assert run(batch_size=2) == run(batch_size=16)


def test_sliding_window_models_sample_exactly_without_shared_caches() -> None:
    """A model whose cache layers keep only a window (Mistral) gets no prefix or row caches and no
    joins into a running batch (turns that rows ask for wait for the batch to end); log-probs stay exact."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=16)  # fmt: skip
    model = MistralForCausalLM(config).eval()
    engine = GenerationEngine(model, stop_ids=list(range(0, 1000, 4)), pad_id=0, sampling=SamplingConfig(min_prefix=8))
    prefix = torch.randint(10, 1000, (40,)).tolist()
    prompts = [prefix + [5, 6, 7], prefix + [8, 9], prefix[:30]]
    seen: list[tuple[list[int], Any]] = []

    def follow(request: Request, sample: Any) -> list[Request]:
        seen.append((request.prompt, sample))
        return [] if request.tag else [Request(request.prompt + sample.ids + [11], 6, tag=1)]

    engine.stream([Request(p, 6) for p in prompts], follow)
    assert len(seen) == 6
    assert engine.stats.prefill_tokens == engine.stats.prompt_tokens  # nothing came from a cache
    for prompt, s in seen:
        fresh = _fresh_logprobs(model, prompt + s.ids, len(s.ids))
        torch.testing.assert_close(torch.tensor(s.logprobs), fresh, atol=1e-4, rtol=0)
