"""Real environments: build one from a Task, execute validated calls, snapshot the state.

:func:`make_environment` builds a task's real environment, wrapped in its drift when the task has
one (:mod:`envace.envs.drift`).
"""

from envace.envs.base import Environment
from envace.envs.drift import (
    DriftedEnvironment,
    DriftSpec,
    accepted_tools,
    canonical_calls,
    canonical_messages,
    canonical_task,
    documented_calls,
    drifted_task,
    make_environment,
    task_drift,
    with_drift,
)
from envace.envs.drift_kinds import KINDS as DRIFT_KINDS

__all__ = [
    "DRIFT_KINDS",
    "DriftSpec",
    "DriftedEnvironment",
    "Environment",
    "accepted_tools",
    "canonical_calls",
    "canonical_messages",
    "canonical_task",
    "documented_calls",
    "drifted_task",
    "make_environment",
    "task_drift",
    "with_drift",
]
