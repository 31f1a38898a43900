"""Callbacks that turn step outputs (episodes, rewards, rollout stats) into ``reward/*``,
``success/*`` and ``rollout/*`` scalars and sample transcripts. The math is in plain functions."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

import lightning.pytorch as pl

from envace.modules.outputs import RLStepOutput, ValStepOutput
from envace.rewards.base import RewardOutput
from envace.rewards.toolf1 import tool_f1
from envace.rollout.episode import Episode, RolloutStats
from envace.rollout.transcript import transcript


def reward_metrics(episodes: list[Episode], rewards: list[RewardOutput], prefix: str = "") -> dict[str, float]:
    """Mean reward and success per benchmark, over all, and the masked count.

    >>> from envace.types import Task
    >>> from types import SimpleNamespace as NS
    >>> eps = [NS(task=Task("a", "bfcl")), NS(task=Task("b", "bfcl")), NS(task=Task("c", "tau2"))]
    >>> rs = [RewardOutput(1.0, True), RewardOutput(0.5), RewardOutput(None)]
    >>> reward_metrics(eps, rs)
    {'reward/bfcl': 0.75, 'success/bfcl': 0.5, 'reward/all': 0.75, 'success/all': 0.5, 'reward/masked': 1.0}
    """
    by: dict[str, list[RewardOutput]] = defaultdict(list)
    for ep, r in zip(episodes, rewards, strict=True):
        if not r.masked:
            by[ep.task.benchmark].append(r)
            by["all"].append(r)
    out: dict[str, float] = {}
    for bench in sorted(by, key=lambda b: b == "all"):
        rs = by[bench]
        out[f"reward/{prefix}{bench}"] = sum(r.score or 0.0 for r in rs) / len(rs)
        out[f"success/{prefix}{bench}"] = sum(r.success for r in rs) / len(rs)
    out[f"reward/{prefix}masked"] = float(sum(r.masked for r in rewards))
    return out


def act_metrics(episodes: list[Episode], prefix: str = "") -> dict[str, float]:
    """How close the act role comes to the gold, below all-or-nothing success: the mean tool-name F1
    (:func:`~envace.rewards.toolf1.tool_f1`) of the calls an episode made against its task's gold
    calls, over episodes whose task has gold, per benchmark and over all.

    >>> from envace.types import CallRecord, Task, ToolCall
    >>> from types import SimpleNamespace as NS
    >>> gold = [[ToolCall("cd", {"folder": "a"}), ToolCall("ls")]]
    >>> ep = NS(task=Task("t", "bfcl", gold=gold), trajectory=lambda: NS(calls=[CallRecord(ToolCall("ls"), {})]))
    >>> act_metrics([ep], prefix="val_")  # 1 of 2 gold names called, 1 of 1 calls right: F1 = 2/3
    {'act/val_tool_f1/bfcl': 0.6666666666666666, 'act/val_tool_f1/all': 0.6666666666666666}
    """
    by: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        if any(ep.task.gold):
            f1 = tool_f1(ep.task, ep.trajectory()).score or 0.0
            by[ep.task.benchmark].append(f1)
            by["all"].append(f1)
    return {f"act/{prefix}tool_f1/{b}": sum(v) / len(v) for b, v in sorted(by.items(), key=lambda kv: kv[0] == "all")}


def group_metrics(episodes: list[Episode], rewards: list[RewardOutput]) -> dict[str, float]:
    """Reward spread within groups: mean std, and the fraction of groups with zero variance."""
    groups: dict[int, list[float]] = defaultdict(list)
    for ep, r in zip(episodes, rewards, strict=True):
        if not r.masked:
            groups[ep.group].append(float(r.score or 0.0))
    if not groups:
        return {}
    stds = []
    for scores in groups.values():
        mean = sum(scores) / len(scores)
        stds.append((sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5)
    return {
        "reward/group_std": sum(stds) / len(stds),
        "reward/zero_variance_groups": sum(s == 0 for s in stds) / len(stds),
    }


def rollout_metrics(stats: RolloutStats) -> dict[str, float]:
    """Per-episode token counts per role, turns, and error/truncation rates."""
    n = max(stats.episodes, 1)
    attempted = stats.calls + stats.format_errors
    return {
        "rollout/act_tokens": stats.act_tokens / n,
        "rollout/rehearse_tokens": stats.rehearse_tokens / n,
        "rollout/context_tokens": stats.context_tokens / n,
        "rollout/turns": stats.turns / n,
        "rollout/calls": stats.calls / n,
        "rollout/format_error_rate": stats.format_errors / attempted if attempted else 0.0,
        "rollout/truncation_rate": stats.truncated / n,
        "rollout/tokens_per_s": stats.generated_tokens_per_s,
        "rollout/seconds": stats.seconds,
    }


def transcript_markdown(episode: Episode, max_chars: int = 6000) -> str:
    """The episode's transcript (:func:`~envace.rollout.transcript.transcript`) as a markdown code
    block, for TensorBoard's text tab (cut to ``max_chars``)."""
    text = transcript(episode)
    cut = text[:max_chars] + ("\n…" if len(text) > max_chars else "")
    return "```\n" + cut.replace("```", "'''") + "\n```"


class RolloutLogger(pl.Callback):
    """Logs ``reward/*``, ``success/*``, ``act/*``, ``rollout/*`` after each RL step and validation epoch."""

    def __init__(self) -> None:
        self._val: list[tuple[Episode, RewardOutput]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if not isinstance(outputs, dict) or "episodes" not in outputs:
            return  # a warm-start step (SFTStepOutput): nothing rolled out
        out = cast(RLStepOutput, outputs)
        scalars = reward_metrics(out["episodes"], out["rewards"])
        scalars |= group_metrics(out["episodes"], out["rewards"])
        scalars |= act_metrics(out["episodes"])
        scalars |= rollout_metrics(out["rollout"])
        pl_module.log_dict(scalars, batch_size=len(out["episodes"]))

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if isinstance(outputs, dict) and "episodes" in outputs:
            out = cast(ValStepOutput, outputs)
            self._val.extend(zip(out["episodes"], out["rewards"], strict=True))

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._val:
            return
        episodes, rewards = zip(*self._val, strict=True)
        scalars = reward_metrics(list(episodes), list(rewards), prefix="val_") | act_metrics(list(episodes), "val_")
        pl_module.log_dict(scalars, batch_size=len(episodes), sync_dist=True)
        if not trainer.sanity_checking:
            experiment: Any = getattr(trainer.logger, "experiment", None)
            if hasattr(experiment, "add_text"):
                experiment.add_text("samples/transcript", transcript_markdown(episodes[0]), trainer.global_step)
        self._val.clear()
