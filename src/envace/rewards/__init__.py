"""Reward functions by name, and the choice of reward for a task.

A reward is a plain function ``(task, traj) -> RewardOutput`` (docs/design.md §3.5, STYLE.md row 4).
:data:`REWARDS` names them as ``"module:function"`` strings, imported on first use, so that a
benchmark's heavy imports (bfcl-eval, tau2) happen only when its reward is used. A reward that needs
an environment is registered by its own, later package (:func:`register_reward`): ``envs`` registers
``python-env`` (a TRL-shaped class's ``get_reward()``) when it is imported, as every source of such
tasks (``envace.data.sources``) does.

Which reward a task gets (:func:`reward_for`):

===================================  =====================
task                                 reward
===================================  =====================
``task.extra["reward"]`` is set      that name (override)
bfcl, category ``multi_turn_*``      ``bfcl-multi-turn``
bfcl, single-turn AST categories     ``bfcl-single-turn``
tau2                                 ``tau2``
vitabench                            ``vitabench``
finmcp, chatlog                      ``toolf1``
tasks (your own: docs/own-tools.md)  ``gold-calls``
===================================  =====================

A reward named ``package.module:function`` (``task.extra["reward"]``, e.g. the ``tasks`` source's
``reward`` option) is the user's own (:mod:`envace.rewards.userfn`).

BFCL's agentic categories (memory, web search) and format sensitivity have no offline reward here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from functools import cache

from envace.rewards.base import RewardError, RewardOutput, RewardUnavailable
from envace.rewards.judge import JudgeSettings, LLMJudge
from envace.rewards.userfn import user_reward
from envace.types import END_FLAGS, MAX_STEPS, Task, Trajectory

RewardFn = Callable[[Task, Trajectory], RewardOutput]

REWARDS: dict[str, str] = {
    "bfcl-single-turn": "envace.rewards.bfcl:bfcl_single_turn",
    "bfcl-multi-turn": "envace.rewards.bfcl_turns:bfcl_multi_turn",
    "tau2": "envace.rewards.tau2:tau2_reward",
    "toolf1": "envace.rewards.toolf1:tool_f1",
    "vitabench": "envace.rewards.vitabench:vitabench_proxy",
    "judge": "envace.rewards.judge:judge_reward",
    "gold-calls": "envace.rewards.gold:gold_calls",  # your own tasks' gold calls (docs/own-tools.md)
    "gold-writes": "envace.rewards.gold:gold_writes",  # ShopWorld: writes and required reads (docs/shopworld.md)
}

BY_BENCHMARK: dict[str, str] = {
    "tau2": "tau2",
    "vitabench": "vitabench",
    "finmcp": "toolf1",
    "chatlog": "toolf1",
    "tasks": "gold-calls",
    "shopworld": "gold-writes",
}

#: limit flags whose episodes the benchmark's own scorer fails outright, by reward: bfcl-eval's runner
#: force-terminates a turn at its step limit, tau2 ends the conversation on any limit. The training
#: reward fails them too (:func:`compute_reward` ``ended_by``), so it never pays what the benchmark fails.
LIMIT_FAILS: dict[str, frozenset[str]] = {
    "bfcl-multi-turn": frozenset({MAX_STEPS}),
    "tau2": frozenset(END_FLAGS),
}

_BFCL_SINGLE_TURN_PREFIXES = ("simple", "multiple", "parallel", "irrelevance", "live_")


def register_reward(name: str, target: str) -> None:
    """Add reward ``name``, ``target`` a ``"module:function"`` string imported on first use: how a package
    above this one registers a reward that needs it (``envace.envs`` registers ``python-env``). The same
    registration again is a no-op; another target for a registered name is an error.

    >>> register_reward("toolf1", "envace.rewards.toolf1:tool_f1")
    >>> register_reward("toolf1", "mine:f")
    Traceback (most recent call last):
    ValueError: reward 'toolf1' is already registered as 'envace.rewards.toolf1:tool_f1', not 'mine:f'
    """
    if REWARDS.setdefault(name, target) != target:
        raise ValueError(f"reward {name!r} is already registered as {REWARDS[name]!r}, not {target!r}")


@cache
def get_reward(name: str) -> RewardFn:
    """The reward function registered as ``name`` (imported on first use).

    >>> get_reward("bfcl-multi-turn").__name__
    'bfcl_multi_turn'

    A name ``package.module:function`` is the user's own (:func:`envace.rewards.userfn.user_reward`).
    """
    if name not in REWARDS and ":" in name:
        return user_reward(name)
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known: {', '.join(sorted(REWARDS))}")
    module, fn = REWARDS[name].split(":")
    return getattr(importlib.import_module(module), fn)  # type: ignore[no-any-return]


def reward_name(task: Task) -> str:
    """The registry name of the reward for ``task`` (see the table in this module's docstring).

    >>> reward_name(Task(id="x", benchmark="bfcl", category="multi_turn_base"))
    'bfcl-multi-turn'
    >>> reward_name(Task(id="x", benchmark="bfcl", category="live_parallel"))
    'bfcl-single-turn'
    """
    if task.extra.get("reward"):
        return str(task.extra["reward"])
    if task.benchmark == "bfcl":
        if task.category.startswith("multi_turn"):
            return "bfcl-multi-turn"
        if task.category.startswith(_BFCL_SINGLE_TURN_PREFIXES):
            return "bfcl-single-turn"
        raise ValueError(f"no offline reward for BFCL category {task.category!r} (task {task.id})")
    if task.benchmark in BY_BENCHMARK:
        return BY_BENCHMARK[task.benchmark]
    raise ValueError(f"no reward for benchmark {task.benchmark!r} (task {task.id}); set task.extra['reward']")


def reward_for(task: Task) -> RewardFn:
    """The reward function for ``task``."""
    return get_reward(reward_name(task))


def compute_reward(
    task: Task, traj: Trajectory, judge: JudgeSettings | None = None, ended_by: Collection[str] = ()
) -> RewardOutput:
    """Score ``traj`` with :func:`reward_for` ``(task)``.

    A reward that cannot be computed says so: it returns ``score=None`` (the judge when its endpoint
    fails) or raises :class:`~envace.rewards.base.RewardUnavailable`; the episode is then masked,
    not scored 0 (docs/design.md §3.5), and counted (``train/reward/masked``). Any other exception is a
    bug: it is raised again as a :class:`~envace.rewards.base.RewardError` naming the reward and the
    task, and stops the run, instead of silently shrinking every batch.

    Args:
        task: the task the trajectory attempted.
        traj: the finished trajectory.
        judge: the endpoint, model, deadline, retries and budget of the ``judge`` reward; by
            default they are read from the ``ENVACE_JUDGE_*`` environment variables
            (:func:`envace.rewards.judge.settings_from_env`).
        ended_by: the limits that ended the episode; one the benchmark's scorer fails outright
            (:data:`LIMIT_FAILS`) scores 0 whatever the calls.

    >>> traj = Trajectory(Task("t", "bfcl", category="multi_turn_base", gold=[[]]), [])
    >>> compute_reward(traj.task, traj, ended_by={"max_steps"})
    RewardOutput(score=0.0, success=False, details={'ended_by': ['max_steps'], 'reward': 'bfcl-multi-turn'})
    """
    name = reward_name(task)
    cut = sorted(LIMIT_FAILS.get(name, frozenset()) & set(ended_by))
    if cut:
        return RewardOutput(0.0, False, {"ended_by": cut, "reward": name})
    try:
        fn = LLMJudge.from_settings(judge) if judge is not None and name == "judge" else get_reward(name)
        return fn(task, traj)
    except RewardUnavailable as exc:
        return RewardOutput(None, False, {"error": f"{type(exc).__name__}: {exc}", "reward": name})
    except Exception as exc:
        raise RewardError(f"reward {name!r} raised on task {task.id!r}: {type(exc).__name__}: {exc}") from exc


__all__ = [
    "LIMIT_FAILS",
    "REWARDS",
    "JudgeSettings",
    "RewardError",
    "RewardFn",
    "RewardOutput",
    "RewardUnavailable",
    "compute_reward",
    "register_reward",
    "get_reward",
    "reward_for",
    "reward_name",
]
