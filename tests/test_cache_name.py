"""The cache keyword follows the installed transformers: ``cache`` in recent 5.x, ``past_key_values``
before the rename (5.17, the GPU machine's image), where a ``cache=`` keyword is silently dropped and
the engine's and the shared prefix's caches stay empty."""

from __future__ import annotations

import inspect

import torch
from transformers import LlamaForCausalLM

from envace.data.batch import TokenBatch
from envace.modules.logprobs import prefix_shared_logprobs, selected_logprobs
from envace.policy import LoraSpec, apply_lora, cache_kwarg, tiny_config
from envace.rollout import GenerationEngine, SamplingConfig


class PastKeyValuesLlama(LlamaForCausalLM):
    """transformers 5.17's forward: the cache is ``past_key_values``; an unknown ``cache=`` lands in
    ``**kwargs`` and is never read."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,  # type: ignore[override]
                use_cache=None, logits_to_keep=0, **kwargs):  # fmt: skip
        kwargs.pop("cache", None)
        return super().forward(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=past_key_values,
            use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs,
        )  # fmt: skip


def _old_style(tokenizer) -> PastKeyValuesLlama:
    torch.manual_seed(0)
    return PastKeyValuesLlama(tiny_config(tokenizer))


def test_the_keyword_is_the_one_the_forward_takes(tokenizer, tiny_model) -> None:
    old = _old_style(tokenizer)
    assert cache_kwarg(old, "c") == {"past_key_values": "c"}
    assert cache_kwarg(apply_lora(old, LoraSpec(r=2)), "c") == {"past_key_values": "c"}  # peft: the base's
    assert list(cache_kwarg(tiny_model, "c")) == [
        "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"
    ]


def test_a_shared_prefix_is_cached_under_the_old_keyword(tokenizer) -> None:
    model = _old_style(tokenizer)
    torch.manual_seed(1)
    prefix = torch.randint(10, 1000, (40,))
    ids = torch.stack([torch.cat([prefix, torch.randint(10, 1000, (12,))]) for _ in range(2)])
    loss = torch.zeros(ids.shape)
    loss[:, 44:] = 1
    batch = TokenBatch(ids, torch.ones_like(ids), loss.long(), loss, torch.zeros_like(loss))
    with torch.no_grad():
        shared, plain = prefix_shared_logprobs(model, batch, 40), selected_logprobs(model, batch)
    torch.testing.assert_close(shared[:, 44:], plain[:, 44:], atol=1e-5, rtol=0)


def test_the_engine_samples_from_its_cache_under_the_old_keyword(tokenizer) -> None:
    model = _old_style(tokenizer)
    engine = GenerationEngine(model, stop_ids=[-1], pad_id=2, sampling=SamplingConfig(min_prefix=8))
    torch.manual_seed(2)
    prompt = torch.randint(10, 1000, (30,)).tolist()
    (sample,) = engine.generate([prompt], 5)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + sample.ids])).logits[0].float()
    ids = torch.tensor(prompt + sample.ids)
    fresh = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None]).squeeze(-1)[-5:]
    torch.testing.assert_close(torch.tensor(sample.logprobs), fresh, atol=1e-4, rtol=0)
