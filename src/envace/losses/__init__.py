"""Pure loss math (STYLE.md row 2): tensors in, ``(loss, stats)`` out; configs pick a loss module
by ``class_path`` (``envace.losses.RoleGRPOLoss``, ``envace.losses.RoleNLLLoss``)."""

from envace.losses.grpo import (
    LossInputs,
    RoleGRPOLoss,
    clipped_surrogate,
    role_presence,
    rolewise_advantages,
    token_advantages,
)
from envace.losses.sft import RoleNLLLoss, gather_logprobs, role_weighted_nll

__all__ = [
    "LossInputs",
    "RoleGRPOLoss",
    "RoleNLLLoss",
    "clipped_surrogate",
    "gather_logprobs",
    "role_presence",
    "role_weighted_nll",
    "rolewise_advantages",
    "token_advantages",
]
