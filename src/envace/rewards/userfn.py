"""Rewards and other plug-ins named ``package.module:name`` in a config, so a user adds one without editing EnvACE.

:func:`import_named` imports what a name says (config data, never model output) or says in one line
why it cannot; :func:`user_reward` wraps a user's ``fn(task, trajectory)`` that returns a score in
[0, 1], ``None`` for "cannot compute" (the episode is masked and counted in ``train/reward/masked``,
as the built-in rewards' outages are), or a :class:`~envace.rewards.base.RewardOutput`. A score out
of [0, 1], or anything else, is a bug of the function: :func:`envace.rewards.compute_reward` stops
the run with a :class:`~envace.rewards.base.RewardError` naming it and the task. :func:`probe_reward`
finds such a bug before anything is built: the signature, then one call on a task with no calls yet
(what an untrained policy's first episodes look like).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from typing import Any

from envace.rewards.base import RewardOutput, RewardUnavailable
from envace.types import Task, Trajectory


def import_named(name: str, what: str) -> Any:
    """``package.module:attribute`` (a bare ``module`` for the module), imported; a one-line
    :class:`ValueError` naming it when it cannot be.

    >>> import_named("json:dumps", "reward").__name__
    'dumps'
    >>> import_named("json:nope", "reward")
    Traceback (most recent call last):
    ValueError: reward 'json:nope': module 'json' has no attribute 'nope'
    >>> import_named("no_such_module_x:f", "source")
    Traceback (most recent call last):
    ValueError: source 'no_such_module_x:f': ModuleNotFoundError: No module named 'no_such_module_x'
    """
    module, _, attr = name.partition(":")
    try:
        obj = importlib.import_module(module)
        return getattr(obj, attr) if attr else obj
    except Exception as exc:  # the user's module: whatever its import raises is named in one line
        lines = str(exc).strip().splitlines()
        why = lines[0][:200] if lines else ""
        why = why if isinstance(exc, AttributeError) else f"{type(exc).__name__}: {why}".rstrip(": ")
        raise ValueError(f"{what} {name!r}: {why}") from None


def named_callable(name: str, what: str) -> Callable[..., Any]:
    """:func:`import_named` for a ``module:function`` that must be callable."""
    if name.count(":") != 1 or not all(name.split(":")):
        raise ValueError(f"{what} {name!r}: not a registered name nor 'package.module:function'")
    fn = import_named(name, what)
    if not callable(fn):
        raise ValueError(f"{what} {name!r}: not callable ({type(fn).__name__})")
    return fn  # type: ignore[no-any-return]


def user_reward(name: str) -> Callable[[Task, Trajectory], RewardOutput]:
    """The user's reward ``name`` (``package.module:function``) as a reward function (module docstring)."""
    fn = named_callable(name, "reward")

    def reward(task: Task, traj: Trajectory) -> RewardOutput:
        out = fn(task, traj)
        if out is None:
            raise RewardUnavailable(f"{name} could not compute this episode's reward (it returned None)")
        if isinstance(out, RewardOutput):
            score = out.score
        elif isinstance(out, int | float) and not isinstance(out, bool):
            score, out = float(out), None
        else:
            raise TypeError(f"{name} returned {type(out).__name__}; a reward returns a float in [0, 1] or None")
        if score is not None and not (math.isfinite(score) and 0.0 <= score <= 1.0):
            raise ValueError(f"{name} returned {score!r}, outside [0, 1]")
        if out is not None:
            return out
        return RewardOutput(score, score is not None and score >= 1.0, {"reward": name})

    reward.__name__ = name.replace(":", ".")
    return reward


def probe_reward(name: str, task: Task) -> None:
    """Call the user's reward ``name`` once on ``task`` with an episode that made no call: a one-line
    :class:`ValueError` when it cannot take ``(task, trajectory)``, raises, or returns what a reward
    must not (a string, a score out of [0, 1]); ``None`` ("cannot compute") passes.

    >>> probe_reward("json:loads", Task("t", "b", user_turns=["hi"]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: reward 'json:loads' takes (s, *, cls=None, ...); a reward is fn(task, trajectory)
    >>> probe_reward("operator:eq", Task("t", "b", user_turns=["hi"]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: reward 'operator:eq' on a probe episode (task t, no calls): TypeError: operator:eq returned bool; ...
    """
    fn = named_callable(name, "reward")
    try:
        inspect.signature(fn).bind(task, Trajectory(task=task, messages=[]))
    except TypeError:
        raise ValueError(f"reward {name!r} takes {inspect.signature(fn)}; a reward is fn(task, trajectory)") from None
    except ValueError:  # a builtin without a signature: the probe call says whether it fits
        pass
    try:
        user_reward(name)(task, Trajectory(task=task, messages=[]))
    except RewardUnavailable:
        return
    except Exception as exc:  # the user's code: whatever it raises is named in one line
        lines = str(exc).strip().splitlines()
        why = f"{type(exc).__name__}: {lines[0][:200] if lines else ''}".rstrip(": ")
        raise ValueError(f"reward {name!r} on a probe episode (task {task.id}, no calls): {why}") from None
