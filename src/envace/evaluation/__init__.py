"""Benchmark evaluation with test-time private rehearsal (``envace evaluate``; docs/evaluation.md)."""

from __future__ import annotations

from envace.evaluation.base import Benchmark, ItemResult, Summary, TaskFilter
from envace.evaluation.policies import Policy, PolicyConfig, load_eval_policy
from envace.evaluation.report import Row
from envace.evaluation.run import EvalResult, evaluate, main, run_setting
from envace.evaluation.users import ModelUser, UserSimConfig

__all__ = [
    "Benchmark",
    "EvalResult",
    "ItemResult",
    "ModelUser",
    "Policy",
    "PolicyConfig",
    "Row",
    "Summary",
    "TaskFilter",
    "UserSimConfig",
    "evaluate",
    "load_eval_policy",
    "main",
    "run_setting",
]
