"""The Lightning DataModule: benchmark tasks for the rollout and grounded episodes for the warm start.

``setup()`` loads the tasks of each source (:func:`envace.data.sources.load_source`), cuts them to
their first ``max_user_turns`` user turns (:meth:`envace.types.Task.first_turns`), keeps those whose
prompt fits ``max_prompt_tokens``, and, for the warm start, replays the gold of every train task
that has a real environment (:func:`envace.data.grounding.ground`) or recorded responses
(:func:`envace.data.grounding.recorded_trajectory`) or is answered in one act step
(:func:`envace.data.grounding.answer_trajectory`), gives a ``memory_notes`` share of them a memory
note per user turn (:mod:`envace.data.memory_notes`, off by default) and tokenises the result once
(:func:`envace.protocol.tokens.encode_trajectory`).

A training step receives a :class:`~envace.data.batch.StepBatch`: ``tasks_per_step`` tasks to roll
out and, when warm-starting, ``sft_batch_size`` grounded episodes padded into a
:class:`~envace.data.batch.TokenBatch`, with RL's pool of training tasks to draw more from
(:class:`~envace.data.batch.TaskPool`). The order of both is a seeded permutation per epoch
(:class:`~envace.data.steps.StepSampler`), so the same seed gives the same batches, and a resumed
run the batches the uninterrupted one would have read (:class:`~envace.data.steps.StepLoader`).
"""

from __future__ import annotations

import logging
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Sampler

from envace.data.batch import StepBatch, TaskPool
from envace.data.grounding import GroundFailures, GroundingFailed, answer_trajectory, ground, recorded_trajectory
from envace.data.memory_notes import noted
from envace.data.pools import split_pool, spread
from envace.data.sources import SourceSpec
from envace.data.steps import StepDataset, StepKey, StepLoader, StepSampler, as_step_batch
from envace.protocol.render import ChatFormat, ToolStyle, make_format
from envace.protocol.tokens import EpisodeBuilder, EpisodeTensors, PieceEncoder, encode_trajectory
from envace.types import Task, Trajectory

log = logging.getLogger(__name__)


def prompt_tokens(task: Task, encoder: PieceEncoder, fmt: ChatFormat) -> int:
    """Tokens of ``task``'s prompt as the rollout builds it: system turn with the tools, the tools
    added at the first turn, the first user turn (none when a simulator writes it)."""
    ep = EpisodeBuilder(encoder, fmt)
    ep.system(task.system_prompt, task.tools)
    ep.user_turn(task, 0, task.user_turns[0] if task.user_turns else None)
    return len(ep)


def _summary(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


class EnvACEDataModule(pl.LightningDataModule):
    """Tasks for the rollout and grounded episodes for the warm start, as :class:`StepBatch` objects.

    Args:
        sources: the training sources, each ``{"name": ..., "split": "train", "path": null, <source options>}``
            (options such as ``categories`` or ``domains`` may also sit under an ``options`` key).
        val_sources: the held-out validation sources, same shape; empty: no validation.
        tokenizer: name or path of the policy's tokenizer (``smollm2-135m``, ``tiny``, a hub id, a folder).
        tool_style: how the built-in format lists tools: ``json`` (full schemas) or ``compact``.
        chat_format: ``auto``, ``template`` or ``hermes`` (see :func:`envace.protocol.render.make_format`).
        max_prompt_tokens: keep only tasks whose prompt (system turn with the tools, tools added at the
            first turn, first user turn, tokenised as the rollout does) has at most this many tokens.
        val_max_prompt_tokens: the same cap for validation tasks (default: ``max_prompt_tokens``); held-out
            tool sets can have longer prompts than the training ones.
        max_user_turns: cut every task to its first k user turns (gold, added tools, records with them).
        tasks_per_step: tasks in one training (and validation) batch.
        sft_batch_size: grounded episodes in one training batch.
        warm_start: ground the training tasks and give each training batch grounded episodes.
        max_sft_tokens: drop grounded episodes longer than this many tokens.
        memory_notes: the fraction of grounded episodes (drawn by the data seed) whose every user turn is
            followed by a test-time memory note of two imagined attempts, the gold and a corrupted one
            (:mod:`envace.data.memory_notes`; context, never in the loss; an episode the note makes
            longer than ``max_sft_tokens`` is kept without it); 0 (default): none.
        val_tasks: use at most this many validation tasks, spread evenly over the (length-filtered)
            validation set in source order, so that a few tasks still cover its categories and
            API classes rather than the first scenario family.
        limit: use at most this many training tasks (the first ones that pass the filters, in source order).
        rl_share: the share of the training scenarios that only RL rolls out, the rest only grounded
            for the warm start (:mod:`envace.data.pools`); 0 (default): both use every training task.
        rl_sources: RL's own sources (same shape; ``limit`` not applied): RL rolls out these, the warm start
            grounds ``sources`` (ShopWorld's ``rl`` and ``sft`` splits); empty (default): ``rl_share`` decides.
        max_ground_failed: the share of grounded tasks a server failure may drop before the fit stops.
        seed: seed of the per-epoch order of tasks and grounded episodes; ``None`` (default): the run's
            ``seed_everything`` (runs of other seeds see other orders: else a control's seeds are one run).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        sources: list[dict[str, Any]],
        val_sources: list[dict[str, Any]] | None = None,
        tokenizer: str = "smollm2-135m",
        tool_style: ToolStyle = "json",
        chat_format: str = "auto",
        max_prompt_tokens: int | None = None,
        val_max_prompt_tokens: int | None = None,
        max_user_turns: int | None = None,
        tasks_per_step: int = 1,
        sft_batch_size: int = 2,
        warm_start: bool = True,
        max_sft_tokens: int | None = None,
        memory_notes: float = 0.0,
        val_tasks: int | None = None,
        limit: int | None = None,
        rl_share: float = 0.0,
        rl_sources: list[dict[str, Any]] | None = None,
        max_ground_failed: float = 0.1,
        seed: int | None = None,
        num_workers: int = 0,
    ):
        super().__init__()
        if tasks_per_step < 1 or sft_batch_size < 1:
            raise ValueError(f"tasks_per_step and sft_batch_size must be >= 1, got {tasks_per_step}, {sft_batch_size}")
        if tool_style not in ("json", "compact"):
            raise ValueError(f"tool_style must be 'json' or 'compact', got {tool_style!r}")
        if not 0.0 <= memory_notes <= 1.0:
            raise ValueError(f"memory_notes must be a fraction in [0, 1], got {memory_notes}")
        self.save_hyperparameters()
        self.sources = [SourceSpec.parse(s) for s in sources]
        self.val_sources = [SourceSpec.parse(s) for s in val_sources or []]
        self.tokenizer_name, self.tool_style, self.chat_format = tokenizer, tool_style, chat_format
        self.max_prompt_tokens, self.max_user_turns = max_prompt_tokens, max_user_turns
        self.val_max_prompt_tokens = val_max_prompt_tokens if val_max_prompt_tokens is not None else max_prompt_tokens
        self.tasks_per_step, self.sft_batch_size = tasks_per_step, sft_batch_size
        self.warm_start, self.max_sft_tokens, self.memory_notes = warm_start, max_sft_tokens, memory_notes
        self.val_tasks, self.limit, self.seed, self.num_workers = val_tasks, limit, seed, num_workers
        self.rl_share, self.rl_sources = rl_share, [SourceSpec.parse(s) for s in rl_sources or []]
        self.max_ground_failed, self.ground_failures = max_ground_failed, GroundFailures()
        self.train_set: list[Task] = []
        self.val_set: list[Task] = []
        self.episodes: list[EpisodeTensors] = []
        self.counts: Counter[str] = Counter()
        self._encoder: PieceEncoder | None = None
        self._fmt: ChatFormat | None = None
        self._ready = False

    # -- tokenisation --------------------------------------------------------------------------
    @property
    def encoder(self) -> PieceEncoder:
        if self._encoder is None:
            from envace.policy import load_tokenizer

            self._encoder = PieceEncoder(load_tokenizer(self.tokenizer_name))
        return self._encoder

    @property
    def fmt(self) -> ChatFormat:
        if self._fmt is None:
            self._fmt = make_format(self.encoder.tokenizer, prefer=self.chat_format, tool_style=self.tool_style)
        return self._fmt

    def prompt_tokens(self, task: Task) -> int:
        return prompt_tokens(task, self.encoder, self.fmt)

    # -- setup ---------------------------------------------------------------------------------
    def _load(self, specs: list[SourceSpec], split: str, cap: int | None, max_tokens: int | None) -> list[Task]:
        tasks = [t for spec in specs for t in spec.load()]
        self.counts[f"{split}_loaded"] = len(tasks)
        tasks = [t.first_turns(self.max_user_turns) for t in tasks]
        self.counts[f"{split}_truncated"] = sum("truncated_from" in t.extra for t in tasks)
        if max_tokens is not None:
            tasks = [t for t in tasks if self.prompt_tokens(t) <= max_tokens]
        self.counts[f"{split}_filtered_by_length"] = self.counts[f"{split}_loaded"] - len(tasks)
        if cap is not None:
            tasks = spread(tasks, cap) if split == "val" else tasks[:cap]
        self.counts[f"{split}_tasks"] = len(tasks)
        return tasks

    def _trajectory(self, task: Task) -> Trajectory | None:
        traj: Trajectory | None
        if task.env:
            try:
                traj = ground(task)
            except GroundingFailed as exc:  # the server failed, not the gold: never a training target
                self.ground_failures.add(exc, self.counts)
                return None
            except Exception as exc:  # a gold that cannot be replayed: skip the task, keep the rest
                self.counts["ground_failed"] += 1
                log.warning("task %s: grounding failed (%s: %s)", task.id, type(exc).__name__, exc)
                return None
            self.counts["grounded"] += 1
            return traj
        if task.extra.get("first_step_answer"):
            traj = answer_trajectory(task)
            self.counts["answered" if traj is not None else "ground_skipped_no_env"] += 1
            return traj
        traj = recorded_trajectory(task)
        self.counts["recorded" if traj is not None else "ground_skipped_no_env"] += 1
        return traj

    def _ground(self, tasks: list[Task]) -> list[EpisodeTensors]:
        trajs = [t for t in map(self._trajectory, tasks) if t is not None]
        self.ground_failures.check(self.counts["grounded"], self.max_ground_failed)
        episodes = []
        for traj, with_notes in zip(trajs, noted(trajs, self.memory_notes, self.data_seed), strict=True):
            ep = self._encode(with_notes) if with_notes is not None else None
            if ep is not None and not self._fits(ep):  # the notes make it too long: kept without them
                self.counts["memory_notes_too_long"] += 1
                ep = None
            self.counts["memory_notes"] += ep is not None
            if ep is None:
                ep = self._encode(traj)
            if not self._fits(ep):
                self.counts["sft_dropped_long"] += 1
                continue
            episodes.append(ep)
        self.counts["sft_episodes"] = len(episodes)
        return episodes

    def _encode(self, traj: Trajectory) -> EpisodeTensors:
        return encode_trajectory(traj, self.encoder, self.fmt).tensors()

    def _fits(self, ep: EpisodeTensors) -> bool:
        return self.max_sft_tokens is None or len(ep.input_ids) <= self.max_sft_tokens

    def setup(self, stage: str | None = None) -> None:
        """Load, cut, filter, ground and tokenise (once; later calls do nothing)."""
        if self._ready:
            return
        grounded, self.train_set = split_pool(self._load(self.sources, "train", self.limit, self.max_prompt_tokens),
                                              self.rl_share)  # fmt: skip
        if self.rl_sources:
            self.train_set = self._load(self.rl_sources, "rl", None, self.max_prompt_tokens)
        self.counts["rl_tasks"] = len(self.train_set)
        self.val_set = self._load(self.val_sources, "val", self.val_tasks, self.val_max_prompt_tokens)
        self.episodes = self._ground(grounded) if self.warm_start else []
        self._ready = True
        c = self.counts
        log.info(
            "data: train %d loaded, %d cut to %s user turns, %d filtered by length, %d kept (%d for RL); "
            "val %d loaded, %d filtered, %d kept; grounded %d (recorded %d, answer steps %d, no env %d, failed %d), "
            "%d too long, "
            "%d SFT episodes (%d with memory notes)", c["train_loaded"], c["train_truncated"], self.max_user_turns,
            c["train_filtered_by_length"], c["train_tasks"], c["rl_tasks"], c["val_loaded"],
            c["val_filtered_by_length"], c["val_tasks"], c["grounded"], c["recorded"], c["answered"],
            c["ground_skipped_no_env"],
            c["ground_failed"], c["sft_dropped_long"], len(self.episodes), c["memory_notes"],
        )  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Counts of the last :meth:`setup` and prompt/episode token summaries (min, median, max)."""
        return {
            "counts": dict(self.counts),
            "prompt_tokens": {
                "train": _summary([self.prompt_tokens(t) for t in self.train_set]),
                "val": _summary([self.prompt_tokens(t) for t in self.val_set]),
            },
            "sft_tokens": _summary([len(e.input_ids) for e in self.episodes]),
        }

    @property
    def data_seed(self) -> int:
        """``seed``, else the run's ``seed_everything`` (``PL_GLOBAL_SEED``), else 0."""
        return self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))

    # -- loaders -------------------------------------------------------------------------------
    @property
    def pad_id(self) -> int:
        return int(self.encoder.tokenizer.pad_token_id)

    def train_dataloader(self) -> DataLoader[StepBatch]:
        """One :class:`StepBatch` per step, each carrying RL's :class:`TaskPool` (its training tasks and the
        data seed) for dynamic sampling; an epoch is ``ceil(len(train tasks) / tasks_per_step)`` steps."""
        if not self.train_set:
            raise ValueError("no training tasks: check the sources, max_prompt_tokens and limit (stats())")
        n, k = len(self.train_set), self.tasks_per_step
        steps = StepSampler(n, k, len(self.episodes), self.sft_batch_size, self.data_seed)
        dataset = StepDataset(self.train_set, self.episodes, self.pad_id, TaskPool(self.train_set, self.data_seed))
        if self.trainer is not None and self.trainer.distributed_sampler_kwargs is not None:
            # under a distributed strategy (DDP, FSDP2: on one process too) Lightning re-creates the
            # loader around a DistributedSampler, which shares out the epoch's steps by position and
            # cannot rebuild a StepLoader: resuming there restarts the epoch (Lightning warns)
            return self._loader(dataset, steps)
        return StepLoader(dataset, steps, lambda: self.trainer.global_step if self.trainer else 0, self.num_workers)

    def val_dataloader(self) -> DataLoader[StepBatch]:
        """The validation tasks in source order, ``tasks_per_step`` per batch (the last may hold fewer),
        without grounded episodes or a pool; no batches when there are no validation tasks."""
        k, n = self.tasks_per_step, len(self.val_set)
        keys: list[StepKey] = [(tuple(range(i, min(i + k, n))), ()) for i in range(0, n, k)]
        return self._loader(StepDataset(self.val_set, [], self.pad_id), keys)

    def _loader(self, dataset: StepDataset, steps: Sampler[StepKey] | list[StepKey]) -> DataLoader[StepBatch]:
        # batch_size=None: the sampler yields one step key, the dataset turns it into a StepBatch
        return DataLoader(
            dataset, sampler=steps, batch_size=None, collate_fn=as_step_batch, num_workers=self.num_workers
        )

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a StepBatch's token tensors; its tasks and pool are plain data and stay as they are."""
        if isinstance(batch, StepBatch):
            sft = batch.sft.to(device) if batch.sft is not None else None
            return StepBatch(tasks=batch.tasks, sft=sft, pool=batch.pool)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)
