"""The GPU check's policies: published shapes built from a config with random weights (no download).

``build_model`` saves one as a folder (bf16 weights and the carried tokenizer) that ``envace fit``
loads like any other (``--model.policy.name_or_path FOLDER``); ``layers``/``hidden`` shrink it for
the CPU rehearsal (``scripts/gpu_check.py --small``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Qwen3-0.6B's config.json as published (its vocabulary and special ids are the tokenizer's here)
QWEN3_0_6B = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_act="silu", attention_bias=False,
)  # fmt: skip
#: SmolLM2-135M-Instruct's config (the packaged model's architecture: Llama, 30 layers of 576)
SMOLLM2_135M = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    max_position_embeddings=8192, rope_theta=100_000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    hidden_act="silu",
)  # fmt: skip
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-0.6b": ("Qwen3", QWEN3_0_6B),
    "smollm2-135m": ("Llama", SMOLLM2_135M),
}


def shape_config(name: str, tokenizer: Any, layers: int | None = None, hidden: int | None = None) -> Any:
    """The transformers config of shape ``name`` over ``tokenizer``, shrunk to ``layers`` x ``hidden``
    (4 query and 2 key-value heads, MLP 2 x hidden) when given."""
    import transformers

    family, published = SHAPES[name]
    values = dict(published)
    if layers is not None:
        values["num_hidden_layers"] = layers
    if hidden is not None:
        values.update(hidden_size=hidden, intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden // 4)  # fmt: skip
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    return getattr(transformers, f"{family}Config")(vocab_size=len(tokenizer), **ids, **values)


def build_model(name: str, tokenizer_dir: Path, folder: Path, layers: int | None = None,
                hidden: int | None = None) -> Path:  # fmt: skip
    """Shape ``name`` with random bf16 weights (seed 0) and the tokenizer of ``tokenizer_dir``, saved
    to ``folder`` (kept if already there)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = shape_config(name, tokenizer, layers, hidden)
    torch.manual_seed(0)
    model = getattr(transformers, f"{SHAPES[name][0]}ForCausalLM")(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
