"""Tool-name F1 (FinMCP-Bench's TF1): the episode's calls against the task's gold calls, as multisets of names.

Precision = matched / called, recall = matched / gold, where matched is the size of the multiset
intersection of tool names; F1 is their harmonic mean and the score. Arguments do not enter the
score (TF1 is name-based); ``details`` adds the exact ordered match of names (``exact_names``, the
``success`` flag) and of whole calls, names and arguments (``exact_calls``). Gold is flattened over
user turns. Conventions for empty sides: nothing expected and nothing called scores 1; otherwise an
empty side gives precision or recall 0.
"""

from __future__ import annotations

from collections import Counter

from envace.rewards.base import RewardOutput
from envace.types import Task, Trajectory


def prf(gold: list[str], pred: list[str]) -> tuple[float, float, float]:
    """Precision, recall and F1 of two multisets of names.

    >>> prf(["a", "b", "b"], ["b", "a", "c"])
    (0.6666666666666666, 0.6666666666666666, 0.6666666666666666)
    >>> prf([], []), prf(["a"], [])
    ((1.0, 1.0, 1.0), (0.0, 0.0, 0.0))
    """
    if not gold and not pred:
        return 1.0, 1.0, 1.0
    matched = sum((Counter(gold) & Counter(pred)).values())
    precision = matched / len(pred) if pred else 0.0
    recall = matched / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def tool_f1(task: Task, traj: Trajectory) -> RewardOutput:
    """Score = tool-name F1 of ``traj.calls`` against ``task.gold`` (see the module docstring).

    >>> from envace.types import CallRecord, ToolCall
    >>> t = Task("t", "finmcp", gold=[[ToolCall("quote", {"s": "X"})], [ToolCall("news", {})]])
    >>> run = Trajectory(t, [], [CallRecord(ToolCall("news", {}), {}), CallRecord(ToolCall("quote", {"s": "X"}), {})])
    >>> out = tool_f1(t, run)
    >>> out.score, out.success, out.details["exact_calls"]
    (1.0, False, False)
    """
    gold = [c for turn in task.gold for c in turn]
    pred = [r.call for r in traj.calls]
    gold_names, pred_names = [c.name for c in gold], [c.name for c in pred]
    precision, recall, f1 = prf(gold_names, pred_names)
    exact_names = gold_names == pred_names
    return RewardOutput(
        score=f1,
        success=exact_names,
        details={
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "exact_names": exact_names,
            "exact_calls": exact_names and all(g.arguments == p.arguments for g, p in zip(gold, pred, strict=True)),
            "n_gold": len(gold),
            "n_called": len(pred),
        },
    )
