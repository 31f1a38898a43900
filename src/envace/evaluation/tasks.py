"""Your own tasks (docs/own-tools.md): a split of the ``tasks`` a fit config trained on, committed calls
run in the config's real environment (its MCP server or Python tools), each episode scored by the reward
the fit scored it with (:func:`envace.rewards.compute_reward`: the source's ``reward`` option, your own
``package.module:function`` included; a reward that cannot compute masks the item, never scores it 0).

    envace evaluate --benchmark tasks --tasks.path configs/mcp_example.yaml --tasks.split test --policy <ckpt>

``tasks.path`` is the fit config; its first ``data.sources`` entry names the source, its path, its
environment and its reward, and ``tasks.split`` (default ``test``) replaces its split. Rows per task
category (the rows' ``metadata.category``) and ``[all]``: ``success`` and ``score`` as the reward gives them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from envace.data.sources import SourceSpec
from envace.evaluation.base import Benchmark, ItemResult, Summary, by_category, mean
from envace.evaluation.policies import Policy
from envace.rewards import compute_reward, reward_name
from envace.rewards.base import RewardOutput
from envace.rollout import Episode, RealEnvironment
from envace.rollout.responders import Responder


def fit_source(config: str | None, split: str) -> SourceSpec:
    """The first training source of the fit config ``config``, its split replaced by ``split``."""
    if not config:
        raise ValueError("tasks: pass --tasks.path <the fit config whose data.sources names your tasks>")
    try:
        data = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"tasks: --tasks.path {config}: {str(exc).splitlines()[0]}") from None
    section = data.get("data") if isinstance(data, dict) else None
    sources = section.get("sources") if isinstance(section, dict) else None
    if not isinstance(sources, list) or not sources:
        inline = " (a data section in a file of its own is not read here)" if isinstance(section, str) else ""
        raise ValueError(f"tasks: --tasks.path {config}: no data.sources{inline} (is it the fit config?)")
    return dataclasses.replace(SourceSpec.parse(sources[0]), split=split)


class TasksBenchmark(Benchmark):
    """A split of a fit config's own tasks (see the module docstring)."""

    name = "tasks"
    headline = "success"

    def tasks(self) -> list[Any]:
        tasks = fit_source(self.filter.path, self.filter.split or "test").load()
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
