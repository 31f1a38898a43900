"""Tool-name F1 (FinMCP TF1): multiset precision/recall over names, exact ordered match in the details."""

from __future__ import annotations

import pytest

from envace.rewards.toolf1 import prf, tool_f1
from envace.types import CallRecord, Task, ToolCall, Trajectory

GOLD = [[ToolCall("quote", {"symbol": "X"}), ToolCall("quote", {"symbol": "Y"})], [ToolCall("news", {"n": 3})]]
TASK = Task("t", "finmcp", user_turns=["a", "b"], gold=GOLD)


def episode(*calls: ToolCall) -> Trajectory:
    return Trajectory(TASK, [], [CallRecord(c, {"ok": True}) for c in calls])


def test_gold_episode_scores_one_and_empty_zero() -> None:
    out = tool_f1(TASK, episode(*[c for turn in GOLD for c in turn]))
    assert (out.score, out.success, out.details["exact_calls"]) == (1.0, True, True)
    empty = tool_f1(TASK, episode())
    assert (empty.score, empty.success, empty.details["recall"]) == (0.0, False, 0.0)


def test_name_changes_lower_the_score_and_argument_changes_only_break_exactness() -> None:
    # quote, quote, news -> quote, news, news: 2 of 3 names match on each side
    renamed = tool_f1(TASK, episode(GOLD[0][0], ToolCall("news", {"symbol": "Y"}), GOLD[1][0]))
    assert renamed.score == pytest.approx(2 / 3) and not renamed.success
    reargued = tool_f1(TASK, episode(GOLD[0][0], ToolCall("quote", {"symbol": "Z"}), GOLD[1][0]))
    assert reargued.score == 1.0 and reargued.details["exact_names"] and not reargued.details["exact_calls"]


def test_extra_missing_and_reordered_calls() -> None:
    extra = tool_f1(TASK, episode(*GOLD[0], *GOLD[1], ToolCall("news", {})))
    assert (extra.details["precision"], extra.details["recall"]) == (0.75, 1.0)
    assert extra.score == pytest.approx(2 * 0.75 / 1.75)
    missing = tool_f1(TASK, episode(GOLD[1][0]))
    assert (missing.details["precision"], missing.details["recall"]) == (1.0, pytest.approx(1 / 3))
    reordered = tool_f1(TASK, episode(GOLD[1][0], *GOLD[0]))
    assert reordered.score == 1.0 and not reordered.success


def test_empty_gold() -> None:
    task = Task("t", "finmcp", user_turns=["hi"], gold=[[]])
    assert tool_f1(task, Trajectory(task, [])).score == 1.0
    assert tool_f1(task, Trajectory(task, [], [CallRecord(ToolCall("quote", {}), {})])).score == 0.0
    assert prf(["a"], ["b"]) == (0.0, 0.0, 0.0)
