"""Real environments: build one from a Task, execute validated calls, snapshot the state.

:func:`make_environment` builds a task's real environment, wrapped in its drift when the task has
one (:mod:`envace.envs.drift`). Importing the package registers the reward that needs an environment
(``python-env``, :func:`envace.envs.pytools.python_env_reward`) with :func:`envace.rewards.register_reward`.
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
from envace.rewards import register_reward

# the reward of a TRL-shaped class (its get_reward() after the calls are replayed), registered here, in
# the layer that has environments, so that the rewards below name none
register_reward("python-env", "envace.envs.pytools:python_env_reward")

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
