"""Thin LightningModules: the policy, the per-role loss heads, and the rollout inside the step."""

from envace.modules.base import OptimConfig, PolicyModule
from envace.modules.envace import EnvACEModule
from envace.modules.sft import SFTModule

__all__ = ["EnvACEModule", "OptimConfig", "PolicyModule", "SFTModule"]
