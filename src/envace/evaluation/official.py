"""The benchmarks' own offline scorers on a committed episode (played against the real environment):
the figure that is comparable across training arms and with ``envace evaluate``.

* BFCL multi-turn: bfcl-eval's ``multi_turn_checker`` on the whole episode (per task), and on each
  prefix of its user turns (per turn: the share of turns passed before the first that fails);
* tau2: tau2's own evaluator (:func:`envace.evaluation.tau2.tau2_score`);
* elsewhere (BFCL single-turn runs bfcl-eval's AST checker inside its reward; VitaBench and FinMCP
  have no offline official scorer): ``None``, and only the proxy is reported.

The official code is third-party code reading model output: an exception there masks the episode's
official figure (counted), it does not stop training.
"""

from __future__ import annotations

from envace.data.sources.bfcl import MULTI_TURN_CATEGORIES
from envace.evaluation.bfcl import official_multi_turn, official_verdict, steps_per_turn
from envace.evaluation.tau2 import tau2_score
from envace.rewards.base import RewardOutput
from envace.rollout import Episode
from envace.types import Message


def official_score(episode: Episode) -> RewardOutput | None:
    """The official verdict of a committed episode (``details["turn_score"]`` for BFCL multi-turn);
    masked when the official code raised; ``None`` where the benchmark has no offline scorer."""
    task = episode.task
    try:
        if task.benchmark == "bfcl" and task.category in MULTI_TURN_CATEGORIES:
            return bfcl_per_turn(episode)
        if task.benchmark == "tau2":
            return tau2_score(episode)
    except Exception as exc:  # third-party scorer on model output: the figure is missing, not the run
        return RewardOutput(None, False, {"error": f"{type(exc).__name__}: {exc}"})
    return None


def bfcl_per_turn(episode: Episode) -> RewardOutput:
    """``multi_turn_checker`` on the episode (the score: 1 when every turn passes), and on each prefix
    of its first k user turns: ``details["turn_score"]`` is the share of turns passed before the
    first failing one (the checker compares state turn by turn and stops at the first mismatch)."""
    task = episode.task
    whole = official_multi_turn(task, episode)
    turns = len(task.user_turns)
    passed = turns if whole.success else 0
    if not whole.success and turns > 1:
        passed = 0
        for k in range(1, turns):
            cut = task.first_turns(k)
            if not official_verdict(cut, _first_turns(episode.messages, k), _flags_within(episode, k))["valid"]:
                break
            passed = k
    details = {**whole.details, "turns_passed": passed, "turns": turns, "turn_score": passed / max(turns, 1)}
    return RewardOutput(whole.score, whole.success, details)


def _first_turns(messages: list[Message], k: int) -> list[Message]:
    """The messages before the (k+1)-th user message."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    return messages[: users[k]] if len(users) > k else list(messages)


def _flags_within(episode: Episode, k: int) -> frozenset[str]:
    """The episode's limit flags when it ended within its first ``k`` turns (else none: the limit hit
    a later turn)."""
    return frozenset(episode.flags) if len(steps_per_turn(episode.messages)) <= k else frozenset()
