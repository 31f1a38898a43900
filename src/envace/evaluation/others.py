"""VitaBench and FinMCP-style chat logs.

**VitaBench** tools are not published with executable behaviour, and the data has no recorded
results to replay, so committed calls are answered by a world model: by default the policy itself
(:class:`~envace.rollout.PolicyRehearsal`: the committed execution is the policy's own imagined
world), or a separate frozen simulator model (:class:`~envace.rollout.ExternalSimulator`). The user
is the task's instructions as one opening message (``scripted``), or the local user simulator.
Scores: the deterministic ``required_orders`` proxy (:func:`envace.rewards.vitabench.vitabench_proxy`;
masked for order types it does not know), and VitaBench's rubric judge when ``ENVACE_JUDGE_URL``
points at an OpenAI-compatible endpoint (:class:`envace.rewards.judge.LLMJudge`, the task's state
and overall rubrics as its checklist). VitaBench has no gold calls, so it has no oracle.

**FinMCP-style logs** (:func:`envace.data.sources.chatlog.load_chatlog`, ``benchmark="finmcp"``):
calls are answered from the recorded results (:class:`~envace.rollout.Replay`); scores are tool
precision, recall and F1 over tool-name multisets (TF1) and the exact ordered match
(:func:`envace.rewards.toolf1.tool_f1`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from envace.data.sources import load_source
from envace.evaluation.base import Benchmark, ItemResult, Summary, TaskFilter, by_category, mean
from envace.evaluation.policies import Policy
from envace.rewards.base import RewardOutput
from envace.rewards.judge import LLMJudge
from envace.rewards.toolf1 import tool_f1
from envace.rewards.vitabench import vitabench_proxy
from envace.rollout import Episode, PolicyRehearsal, Replay
from envace.rollout.loop import UserHook
from envace.rollout.responders import Responder


def _with_all(items: list[ItemResult]) -> dict[str, list[ItemResult]]:
    groups = by_category(items)
    if len(groups) > 1:
        groups["[all]"] = items
    return groups


def opening_instructions(episode: Episode) -> str | None:
    """The scripted VitaBench user: the task's instructions as the one opening message."""
    if episode.turn >= 0:
        return None
    sim = episode.task.user_sim or {}
    return str(sim.get("instructions") or "") or None


def rubric_verdict(judge: LLMJudge, episode: Episode) -> dict[str, Any]:
    """The rubric judge's score and details for a VitaBench episode. A judge that fails (masked) or
    raises leaves the item scored by the proxy, flagged ``judge_failed``: a glitch of the remote,
    untrusted judge must not drop the item."""
    rubrics = [*episode.task.extra.get("state_rubrics", []), *episode.task.extra.get("overall_rubrics", [])]
    task = dataclasses.replace(episode.task, extra={**episode.task.extra, "checklist": rubrics})
    try:
        verdict = judge(task, episode.trajectory())
    except Exception as exc:  # the proxy score stands whatever the judge does
        verdict = RewardOutput(None, False, {"error": f"{type(exc).__name__}: {exc}"})
    return {"judge": verdict.score, "judge_details": verdict.details, "judge_failed": verdict.masked}


class VitaBenchmark(Benchmark):
    """VitaBench (see the module docstring).

    Args:
        filter: which tasks (``categories`` = domains; ``path`` or ``$ENVACE_VITABENCH``).
        simulator: builds the committed responder for a policy (``None``: the policy's own rehearsal).
        make_user: builds the user-simulator hook for a model policy (``None``: scripted opening).
        judge: the rubric judge (default: from ``ENVACE_JUDGE_URL``, else none).
    """

    name = "vitabench"
    headline = "proxy"

    def __init__(
        self,
        filter: TaskFilter,
        simulator: Callable[[Policy], Responder] | None = None,
        make_user: Callable[[Policy], UserHook] | None = None,
        judge: LLMJudge | None = None,
    ):
        super().__init__(filter)
        self.simulator, self.make_user = simulator, make_user
        self.judge = judge if judge is not None else LLMJudge.from_env()
        self._user: UserHook | None = None

    def tasks(self) -> list[Any]:
        kw = {"domains": self.filter.categories} if self.filter.categories else {}
        return self.filter.apply(load_source("vitabench", split="all", path=self.filter.path, **kw))

    def responder(self, policy: Policy) -> Responder:
        if self.simulator is not None:
            return self.simulator(policy)
        return PolicyRehearsal()

    def user(self, policy: Policy) -> UserHook:
        if policy.reference or self.make_user is None:
            return opening_instructions
        if self._user is None:
            self._user = self.make_user(policy)
        return self._user

    def score(self, episode: Episode) -> RewardOutput:
        proxy = vitabench_proxy(episode.task, episode.trajectory())
        details = {**proxy.details, "proxy": proxy.score}
        if self.judge is not None:
            details.update(rubric_verdict(self.judge, episode))
        return RewardOutput(proxy.score, proxy.success, details)

    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        rows = []
        for cat, group in _with_all(items).items():
            scored = [it for it in group if it.score is not None]
            rows.append(Summary(cat, "proxy", mean([it.score or 0.0 for it in scored]), group))
            rows.append(Summary(cat, "proxy_success", mean([float(it.success) for it in scored]), group))
            judged = [it.details["judge"] for it in group if it.details.get("judge") is not None]
            if judged:
                rows.append(Summary(cat, "judge", mean(judged), group))
        return rows

    def notes(self) -> list[str]:
        who = "a separate simulator model" if self.simulator else "the policy's own rehearsal (its world model)"
        lines = [f"VitaBench tools are not executable: committed calls were answered by {who}.",
                 "proxy = required-orders proxy (items with unknown order types masked and left out)."]  # fmt: skip
        lines.append("judge: " + ("ENVACE_JUDGE_URL" if self.judge else "not configured (set ENVACE_JUDGE_URL)"))
        return lines


class FinMCPBenchmark(Benchmark):
    """FinMCP-style chat logs with recorded tool results (see the module docstring)."""

    name = "finmcp"
    headline = "tf1"

    def tasks(self) -> list[Any]:
        if not self.filter.path:
            raise ValueError("finmcp: pass --tasks.path <a .jsonl file or folder of OpenAI-chat logs>")
        tasks = load_source("chatlog", split=self.filter.split or "all", path=self.filter.path, benchmark="finmcp")
        tasks = [t if t.category else dataclasses.replace(t, category="all") for t in tasks]
        cats = self.filter.categories
        return self.filter.apply([t for t in tasks if cats is None or t.category in cats])

    def responder(self, policy: Policy) -> Responder:
        return Replay()

    def score(self, episode: Episode) -> RewardOutput:
        return tool_f1(episode.task, episode.trajectory())

    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        rows = []
        for cat, group in _with_all(items).items():
            for metric, key in (("precision", "precision"), ("recall", "recall"), ("tf1", "f1")):
                rows.append(Summary(cat, metric, mean([float(it.details.get(key, 0.0)) for it in group]), group))
            for metric, key in (("exact_match", "exact_names"), ("exact_calls", "exact_calls")):
                rows.append(Summary(cat, metric, mean([float(bool(it.details.get(key))) for it in group]), group))
        return rows
