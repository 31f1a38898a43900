"""What the vLLM server must know of the trained weights, and how it learns it.

* The **base** the server loads: the policy's weights with its LoRA adapters stripped
  (:func:`write_base`), written once, so the served model is exactly the one in memory.
* After every update (the weights' in-place version counters moved, :func:`signature`):
  with LoRA, the adapters are written (``save_pretrained``, ~20 MB for SmolLM2 at r = 16) and loaded
  under a **new name** (:func:`write_adapter`, ``/v1/load_lora_adapter``); without LoRA (full
  fine-tuning) all weights are written and reloaded in place (:func:`write_full`, the
  ``reload_weights`` RPC). Requests name what the current weights were loaded as, and the engine
  checks every answer came from it: a stale adapter is never used silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def is_lora(model: Any) -> bool:
    """Whether ``model`` carries peft LoRA adapters (its updates are adapters)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def lora_rank(model: Any) -> int | None:
    """The adapters' rank (``None`` without LoRA)."""
    if not is_lora(model):
        return None
    return max(int(c.r) for c in model.peft_config.values())


def signature(model: Any) -> tuple[float, ...]:
    """A fingerprint of the weights an update changes (the trainable ones; all of them when none is
    trainable now): their in-place version counters, which move with every optimizer step, and their
    sums, which also move when a write bypasses the counters (``p.data.copy_``, as
    :func:`~envace.modules.simulator.copy_policy_into` writes)."""
    params = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())
    with torch.no_grad():
        sums = torch.stack([p.detach().float().sum() for p in params]).tolist()
    return (*(float(p._version) for p in params), *sums)


def base_state(model: Any) -> dict[str, torch.Tensor]:
    """The base model's state dict without the LoRA adapters (``…q_proj.base_layer.weight`` becomes
    ``…q_proj.weight``): what a server loads as ``--model``."""
    base = model.get_base_model() if is_lora(model) else model
    out = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value
    return out


def write_base(model: Any, tokenizer: Any, folder: Path) -> Path:
    """A ``save_pretrained`` folder of ``model``'s base weights (adapters stripped) and ``tokenizer``."""
    base = model.get_base_model() if is_lora(model) else model
    with torch.no_grad():
        base.save_pretrained(folder, state_dict=base_state(model))
    tokenizer.save_pretrained(folder)
    return folder


def write_adapter(model: Any, folder: Path) -> Path:
    """The peft adapters of ``model`` (its active adapter) as a folder vLLM loads at run time."""
    with torch.no_grad():
        model.save_pretrained(folder)
    return folder


def write_full(model: Any, folder: Path) -> Path:
    """All of ``model``'s weights as safetensors in ``folder`` (for the server's ``reload_weights``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in base_state(model).items()}
    seen: dict[int, str] = {}
    for key in list(state):  # tied tensors (embeddings and lm_head) are written once
        ptr = state[key].data_ptr()
        if ptr in seen:
            del state[key]
        seen.setdefault(ptr, key)
    save_file(state, str(folder / "model.safetensors"))
    return folder
