"""Callbacks that turn step outputs (episodes, rewards, rollout stats) into ``train/*``, ``cost/*`` and
``val/*`` scalars and sample transcripts (every key: docs/metrics.md). The math is in plain functions,
whose keys name no split; the callback puts a training step's under ``train/``."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

import lightning.pytorch as pl

from envace.callbacks.board import write_layout
from envace.modules.outputs import RLStepOutput, ValStepOutput
from envace.modules.scalars import log_step, step_index
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


def act_metrics(episodes: list[Episode], prefix: str = "act/") -> dict[str, float]:
    """How close the act role comes to the gold, below all-or-nothing success: the mean tool-name F1
    (:func:`~envace.rewards.toolf1.tool_f1`) of the calls an episode made against its task's gold
    calls, over episodes whose task has gold, per benchmark and over all.

    >>> from envace.types import CallRecord, Task, ToolCall
    >>> from types import SimpleNamespace as NS
    >>> gold = [[ToolCall("cd", {"folder": "a"}), ToolCall("ls")]]
    >>> ep = NS(task=Task("t", "bfcl", gold=gold), trajectory=lambda: NS(calls=[CallRecord(ToolCall("ls"), {})]))
    >>> act_metrics([ep], prefix="val/committed/act_")  # 1 of 2 gold names called, 1 of 1 calls right: F1 = 2/3
    {'val/committed/act_tool_f1/bfcl': 0.6666666666666666, 'val/committed/act_tool_f1/all': 0.6666666666666666}
    """
    by: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        if any(ep.task.gold):
            f1 = tool_f1(ep.task, ep.trajectory()).score or 0.0
            by[ep.task.benchmark].append(f1)
            by["all"].append(f1)
    return {f"{prefix}tool_f1/{b}": sum(v) / len(v) for b, v in sorted(by.items(), key=lambda kv: kv[0] == "all")}


def rollout_metrics(stats: RolloutStats) -> dict[str, float]:
    """Per-episode token counts per role, turns, calls, and error/truncation rates; the rollout's
    generation rate and wall time."""
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


def cost_metrics(stats: RolloutStats) -> dict[str, float]:
    """``cost/*``: the step's totals (tokens each role generated, calls a real environment answered),
    logged at every step, to sum over a run."""
    return {
        "cost/act_tokens": float(stats.act_tokens),
        "cost/rehearse_tokens": float(stats.rehearse_tokens),
        "cost/env_calls": float(stats.env_calls),
    }


def transcript_markdown(episode: Episode, max_chars: int = 6000) -> str:
    """The episode's transcript (:func:`~envace.rollout.transcript.transcript`) as a markdown code
    block, for TensorBoard's text tab (cut to ``max_chars``)."""
    text = transcript(episode)
    cut = text[:max_chars] + ("\n…" if len(text) > max_chars else "")
    return "```\n" + cut.replace("```", "'''") + "\n```"


def _by_benchmark(episodes: list[Episode], values: list[Any]) -> dict[str, list[Any]]:
    """``values`` (one per episode) grouped by the episode's benchmark, then ``all`` last."""
    by: dict[str, list[Any]] = defaultdict(list)
    for ep, v in zip(episodes, values, strict=True):
        by[ep.task.benchmark].append(v)
        by["all"].append(v)
    return {b: by[b] for b in sorted(by, key=lambda b: b == "all")}


def proxy_metrics(episodes: list[Episode], proxy: list[RewardOutput], family: str) -> dict[str, float]:
    """``val/<family>/proxy_score|proxy_success/<benchmark>`` over the episodes the training proxy
    could score, and ``val/<family>/proxy_masked``. On ``imagined`` episodes (the policy answered its
    own calls) the proxy is biased toward self-rehearsal: for comparison with the committed figures.

    >>> from envace.types import Task
    >>> from types import SimpleNamespace as NS
    >>> out = proxy_metrics([NS(task=Task("a", "bfcl"))], [RewardOutput(1.0, True)], "imagined")
    >>> out["val/imagined/proxy_score/bfcl"], out["val/imagined/proxy_masked"]
    (1.0, 0.0)
    """
    out: dict[str, float] = {}
    for bench, rewards in _by_benchmark(episodes, proxy).items():
        scored = [p for p in rewards if not p.masked]
        if scored:
            out[f"val/{family}/proxy_score/{bench}"] = sum(p.score or 0.0 for p in scored) / len(scored)
            out[f"val/{family}/proxy_success/{bench}"] = sum(p.success for p in scored) / len(scored)
    out[f"val/{family}/proxy_masked"] = float(sum(p.masked for p in proxy))
    return out


def official_scores(episodes: list[Episode]) -> list[RewardOutput | None]:
    """The benchmark's official checker on each episode (:func:`envace.evaluation.official.official_score`;
    ``None`` where it has none offline): the one place the ``official`` figures of training
    (``train/official/*``) and of validation (``val/committed/official_*``) are computed."""
    from envace.evaluation.official import official_score  # loaded on first use: it imports the benchmarks

    return [official_score(e) for e in episodes]


def committed_metrics(
    episodes: list[Episode], official: list[RewardOutput | None], proxy: list[RewardOutput]
) -> dict[str, float]:
    """``val/committed/*``: episodes the policy played against the real environment, scored by the
    benchmark's official checker (``official_*``; BFCL multi-turn also per turn, ``turn_score``) and
    by the training proxy (``proxy_*``, :func:`proxy_metrics`), and the gap between the two over
    episodes that have both (``proxy_gap``: positive when the proxy pays what the official checker
    does not).

    >>> from envace.types import Task
    >>> from types import SimpleNamespace as NS
    >>> eps = [NS(task=Task("a", "bfcl")), NS(task=Task("b", "bfcl"))]
    >>> official = [RewardOutput(0.0, False, {"turn_score": 0.5}), RewardOutput(1.0, True, {"turn_score": 1.0})]
    >>> out = committed_metrics(eps, official, [RewardOutput(1.0, True), RewardOutput(1.0, True)])
    >>> [out[f"val/committed/{k}/bfcl"] for k in ("official_success", "proxy_gap", "turn_score")]
    [0.5, 0.5, 0.75]
    """
    out = proxy_metrics(episodes, proxy, "committed")
    for bench, pairs in _by_benchmark(episodes, list(zip(official, proxy, strict=True))).items():
        both = [(o, p) for o, p in pairs if o is not None and not o.masked]
        if both:
            out[f"val/committed/official_score/{bench}"] = sum(o.score or 0.0 for o, _ in both) / len(both)
            out[f"val/committed/official_success/{bench}"] = sum(o.success for o, _ in both) / len(both)
            gaps = [(p.score or 0.0) - (o.score or 0.0) for o, p in both if not p.masked]
            if gaps:
                out[f"val/committed/proxy_gap/{bench}"] = sum(gaps) / len(gaps)
            turns = [o.details["turn_score"] for o, _ in both if "turn_score" in o.details]
            if turns:
                out[f"val/committed/turn_score/{bench}"] = sum(turns) / len(turns)
    out["val/committed/official_masked"] = float(sum(o is not None and o.masked for o in official))
    return out


def log_scalars(
    trainer: pl.Trainer, pl_module: pl.LightningModule, scalars: dict[str, float], n: int = 1, sync: bool = True
) -> None:
    """Log ``scalars`` at the current step; also in the sanity pass before training (step 0: the
    configs run the whole validation there, ``num_sanity_val_steps: -1``), where Lightning's own
    ``log`` is silent, straight to the loggers (that pass runs on one process's data). ``sync``:
    average over processes (off for figures that are already global, torchmetrics' ``compute``)."""
    if trainer.sanity_checking:
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step_index(trainer))
    else:
        pl_module.log_dict(scalars, batch_size=max(n, 1), sync_dist=sync)


def official_agreement(
    episodes: list[Episode], official: list[RewardOutput | None], proxy: list[RewardOutput]
) -> dict[str, float]:
    """``official/*`` of a training step: the benchmark's official checker on the calls the training
    reward scored (in its own fresh instances, off the training path: it feeds nothing back, and
    its executions are not the arm's ``cost/env_calls``), and how often the two disagree on
    success: ``proxy_only`` (the reward paid what the checker fails: it teaches a wrong thing) and
    ``official_only`` (it withheld what the checker passes). Episodes either side could not score
    are left out; ``official/scored`` counts the rest.

    >>> from envace.types import Task
    >>> from types import SimpleNamespace as NS
    >>> eps = [NS(task=Task(i, "bfcl")) for i in "abc"]
    >>> official = [RewardOutput(0.0, False), RewardOutput(1.0, True), None]
    >>> out = official_agreement(eps, official, [RewardOutput(1.0, True)] * 3)
    >>> [out[f"official/{k}/bfcl"] for k in ("success", "disagree", "proxy_only", "official_only")]
    [0.5, 0.5, 0.5, 0.0]
    >>> out["official/scored"]
    2.0
    """
    out: dict[str, float] = {}
    scored = 0
    for bench, pairs in _by_benchmark(episodes, list(zip(official, proxy, strict=True))).items():
        both = [(o, p) for o, p in pairs if o is not None and o.score is not None and p.score is not None]
        if not both:
            continue
        n = len(both)
        out[f"official/success/{bench}"] = sum(o.success for o, _ in both) / n
        out[f"official/disagree/{bench}"] = sum(o.success != p.success for o, p in both) / n
        out[f"official/proxy_only/{bench}"] = sum(p.success and not o.success for o, p in both) / n
        out[f"official/official_only/{bench}"] = sum(o.success and not p.success for o, p in both) / n
        scored = n if bench == "all" else scored
    if out:
        out["official/scored"] = float(scored)
    return out


class RolloutLogger(pl.Callback):
    """Logs ``train/reward/*``, ``train/success/*``, ``train/act/*``, ``train/rollout/*`` and ``cost/*``
    after each RL step (once, at that step), and after each validation epoch ``val/committed/*`` (the
    policy against the real environment: the official checker, the proxy, their gap,
    ``act_tool_f1``) and ``val/imagined/*`` (the proxy's score of the episodes whose calls the policy
    answered itself — biased toward self-rehearsal, shown for comparison only), with one transcript
    of each family. At fit start it writes TensorBoard's custom-scalars layout
    (:data:`~envace.callbacks.board.LAYOUT`).

    Args:
        official_on_train: also score every training episode with the benchmark's official checker
            and log ``train/official/*`` (:func:`official_agreement`): a training reward that
            disagrees with the benchmark shows up as a curve, not as a surprise at evaluation.
    """

    def __init__(self, official_on_train: bool = True) -> None:
        self._val: list[ValStepOutput] = []
        self._official: list[RewardOutput | None] = []  # the official scores of ``_val``'s committed episodes
        self.official_on_train = official_on_train

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        write_layout(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if not isinstance(outputs, dict) or "episodes" not in outputs:
            return  # a warm-start step (SFTStepOutput): nothing rolled out
        out = cast(RLStepOutput, outputs)
        scalars = reward_metrics(out["episodes"], out["rewards"])
        scalars |= act_metrics(out["episodes"])
        scalars |= rollout_metrics(out["rollout"])
        if self.official_on_train:
            scalars |= official_agreement(out["episodes"], official_scores(out["episodes"]), out["rewards"])
        log_step(pl_module, {f"train/{k}": v for k, v in scalars.items()})
        log_step(pl_module, cost_metrics(out["rollout"]), always=True)
        if "reward/all" in scalars:
            pl_module.log("reward", scalars["reward/all"], prog_bar=True, logger=False, batch_size=len(out["episodes"]))

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        if isinstance(outputs, dict) and "committed" in outputs:
            self._val.append(cast(ValStepOutput, outputs))
            self._official += official_scores(outputs["committed"])

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._val:
            return
        committed = [e for out in self._val for e in out["committed"]]
        official = self._official
        proxy = [p for out in self._val for p in out["proxy"]]
        imagined = [e for out in self._val for e in out["imagined"]]
        imagined_proxy = [p for out in self._val for p in out["imagined_proxy"]]
        scalars = committed_metrics(committed, official, proxy)
        scalars |= act_metrics(committed, prefix="val/committed/act_")
        scalars |= proxy_metrics(imagined, imagined_proxy, "imagined")
        log_scalars(trainer, pl_module, scalars, len(committed))
        experiment: Any = getattr(trainer.logger, "experiment", None)
        if hasattr(experiment, "add_text"):
            for name, episodes in (("committed", committed), ("imagined", imagined)):
                if episodes:
                    experiment.add_text(f"val/{name}/transcript", transcript_markdown(episodes[0]), step_index(trainer))
        self._val.clear()
        self._official = []
