"""ShopWorld (docs/shopworld.md): committed calls run in the real world (a fresh instance per episode),
each episode scored by ``gold-writes``; rows per stratum, the learnable strata S1–S4 together, the S5
control apart, and test's held-out products apart (what only a copied answer passes)."""

from __future__ import annotations

from typing import Any

from envace.data.sources import load_source
from envace.evaluation.base import Benchmark, ItemResult, Summary, by_category, mean
from envace.evaluation.policies import Policy
from envace.rewards.base import RewardOutput
from envace.rewards.gold import gold_writes
from envace.rollout import Episode, RealEnvironment
from envace.rollout.responders import Responder

LEARNABLE = ("S1_copy", "S2_cheaper", "S3_fallback", "S4_carry")


class ShopWorldBenchmark(Benchmark):
    """ShopWorld's ``tune`` or ``test`` split (``tasks.split``; default ``test``)."""

    name = "shopworld"
    headline = "success"

    def tasks(self) -> list[Any]:
        tasks = load_source("shopworld", split=self.filter.split or "test")
        cats = self.filter.categories
        return self.filter.apply([t for t in tasks if cats is None or t.category in cats])

    def responder(self, policy: Policy) -> Responder:
        return RealEnvironment()

    def score(self, episode: Episode) -> RewardOutput:
        out = gold_writes(episode.task, episode.trajectory())
        return RewardOutput(out.score, out.success, {**out.details, "held_out": episode.task.extra["held_out"]})

    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        groups = by_category(items)
        groups["[S1-S4]"] = [it for it in items if it.category in LEARNABLE]
        groups["[held_out]"] = [it for it in items if it.details.get("held_out")]
        groups["[all]"] = items
        rows = []
        for cat, group in groups.items():
            if group:
                rows.append(Summary(cat, "success", mean([float(it.success) for it in group]), group))
                rows.append(Summary(cat, "write_f1", mean([it.score or 0.0 for it in group]), group))
        return rows

    def notes(self) -> list[str]:
        return ["success: the writes and required reads equal the gold's, in order (gold-writes); "
                "S5_control is hidden state no world model can know: read it apart from [S1-S4]."]  # fmt: skip
