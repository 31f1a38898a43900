"""Your own tasks (docs/own-tools.md): a split of the ``tasks`` a fit config trained on, committed calls
run in the config's real environment (its MCP server or Python tools), each episode scored by the reward
the fit scored it with (:func:`envace.rewards.compute_reward`: the source's ``reward`` option, your own
``package.module:function`` included; a reward that cannot compute masks the item, never scores it 0).

    envace evaluate --benchmark tasks --tasks.path configs/mcp_example.yaml --tasks.split test --policy <ckpt>

``tasks.path`` is the fit config, read as ``envace fit`` reads it
(:func:`envace.commands.fit_config.fit_source`, which gives :func:`~envace.evaluation.run.evaluate` its
``source``); its first ``data.sources`` entry names the source, its path, its environment and its
reward, and ``tasks.split`` (default ``test``) replaces its split. Rows per task
category (the rows' ``metadata.category``) and ``[all]``: ``success`` and ``score`` as the reward gives them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from envace.data.sources import SourceSpec
from envace.evaluation.base import Benchmark, ItemResult, Summary, TaskFilter, by_category, mean
from envace.evaluation.policies import Policy
from envace.rewards import compute_reward, reward_name
from envace.rewards.base import RewardOutput
from envace.rollout import Episode, RealEnvironment
from envace.rollout.responders import Responder


class TasksBenchmark(Benchmark):
    """A split of a fit config's own tasks (see the module docstring)."""

    name = "tasks"
    headline = "success"

    def __init__(self, filter: TaskFilter, source: SourceSpec | None):
        super().__init__(filter)
        if source is None:  # envace evaluate reads it from --tasks.path (envace.commands.fit_config.fit_source)
            raise ValueError("tasks: pass --tasks.path <the fit config whose data.sources names your tasks>")
        self.source = source

    def tasks(self) -> list[Any]:
        tasks = dataclasses.replace(self.source, split=self.filter.split or "test").load()
        cats = self.filter.categories
        return self.filter.apply([t for t in tasks if cats is None or t.category in cats])

    def category(self, task: Any) -> str:
        return task.category or "all"

    def responder(self, policy: Policy) -> Responder:
        return RealEnvironment()

    def score(self, episode: Episode) -> RewardOutput:
        traj = episode.trajectory()
        out = compute_reward(traj.task, traj, ended_by=episode.flags)
        return dataclasses.replace(out, details={**out.details, "reward": reward_name(traj.task)})

    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        groups = by_category(items)
        if len(groups) > 1:
            groups["[all]"] = items
        rows = []
        for cat, group in groups.items():
            scored = [it for it in group if it.score is not None]
            rows.append(Summary(cat, "success", mean([float(it.success) for it in scored]), group))
            rows.append(Summary(cat, "score", mean([it.score or 0.0 for it in scored]), group))
        return rows

    def notes(self) -> list[str]:
        return ["success, score: the reward the fit config's source names (masked items left out); "
                "committed calls ran in its real environment."]  # fmt: skip
