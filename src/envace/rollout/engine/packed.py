"""The CPU fast path: a sampling copy of the policy with oneDNN-prepacked linear layers.

On CPUs the engine samples from a copy of the policy whose linear layers hold their weights
prepacked for oneDNN (:class:`PackedLinear`, LoRA merged, rebuilt after every update): a linear
layer then costs about the same for 1 to 8 rows, where the plain fp32 GEMM of 2 or 8 rows costs 2-3x
one row (``SamplingConfig.pack_weights``). ``SamplingConfig.dtype`` can make that copy bfloat16: on
CPUs with ``avx512_bf16``/AMX its matmuls are faster still, and its attention goes through
``envace_sdpa`` (:func:`register_attention`). Where oneDNN cannot pack a dtype
(:func:`envace.hardware.can_prepack`: bf16 without native bf16) the copy keeps plain linear layers.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from envace import hardware

ATTENTION = "envace_sdpa"


class PackedLinear(torch.nn.Module):
    """A linear layer for sampling on CPU, its weight prepacked once for oneDNN.

    ``F.linear`` hands MKL the weight in its plain layout, and MKL's fp32 GEMM re-packs it at every
    call: with 2-8 rows (a decoding step of a small batch) that costs 2-3x one row, and the LM head of
    a 49k vocabulary 1.6-2x. With the weight prepacked (``mkldnn._reorder_linear_weight``), 1, 2 and 8
    rows cost about the same, and one row is faster too (``docs/performance.md``). Inference only.

    Args:
        linear: the layer to pack (its weight and bias are copied; the layer is not kept).
        rows: the row count the packing is tuned for (any count works).
    """

    def __init__(self, linear: torch.nn.Linear, rows: int = 8) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    @staticmethod
    def available(model: Any, dtype: torch.dtype) -> bool:
        """Whether ``model`` can sample through layers packed in ``dtype``: oneDNN packs that dtype on
        this CPU (:func:`envace.hardware.can_prepack`: bf16 needs native bf16; elsewhere the copy keeps
        plain weights, same samples), plain CPU tensors, no FSDP wrapping (a sharded model samples with
        its gathered weights, see ``modules.unsharded``)."""
        params = list(model.parameters())
        return (
            hardware.can_prepack(dtype)
            and all(p.device.type == "cpu" and type(p).__name__ != "DTensor" for p in params)
            and not any(type(m).__name__.startswith("FSDP") for m in model.modules())
        )


def packed_copy(model: Any, dtype: torch.dtype) -> Any:
    """A frozen copy of ``model`` in ``dtype`` for sampling: LoRA adapters merged into the weights,
    every ``nn.Linear`` replaced by a :class:`PackedLinear`."""
    clone = copy.deepcopy(model)
    for p in clone.parameters():
        p.grad = None  # the policy's gradients are not the copy's business
    if hasattr(clone, "merge_and_unload"):  # a peft model: W + scale * B @ A, adapters dropped
        clone = clone.merge_and_unload()
    clone = clone.to(dtype).requires_grad_(False).eval()
    for module in list(clone.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))
    return clone


def _packed_sdpa(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, None]:
    """HF's SDPA attention, kept off the grouped-query (``enable_gqa``) kernel for one query token.

    Without a mask HF decodes through ``enable_gqa``, which on CPUs is ~8× slower in bfloat16 than
    the packed layout it uses when a mask is given (3.7 ms vs 0.47 ms per layer, batch 8, 600
    cached tokens); an all-true mask sends every decoding step the packed way.
    """
    if query.shape[2] == 1 and attention_mask is None:
        attention_mask = torch.ones(1, 1, 1, key.shape[2], dtype=torch.bool, device=query.device)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_attention() -> str:
    """Make :func:`_packed_sdpa` (with HF's SDPA mask) known to transformers as ``envace_sdpa`` and
    return that name, for a config's ``_attn_implementation``. Registering again changes nothing
    (the same function under the same name), so callers need not track whether it was done."""
    AttentionInterface.register(ATTENTION, _packed_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION
