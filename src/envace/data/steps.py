"""The training loader's steps: which tasks and grounded episodes each step reads, seeded per epoch
(:class:`StepSampler`), and resumable where an interrupted run stopped (:class:`StepLoader`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from envace.data.batch import StepBatch, TaskPool, collate_episodes
from envace.protocol.tokens import EpisodeTensors
from envace.types import Task

StepKey = tuple[tuple[int, ...], tuple[int, ...]]  # (task indices, grounded-episode indices) of one step


def _permutation_stream(n: int, count: int, gen: torch.Generator) -> list[int]:
    """``count`` indices from back-to-back random permutations of ``range(n)``."""
    out: list[int] = []
    while n and len(out) < count:
        out += torch.randperm(n, generator=gen).tolist()
    return out[:count]


class StepSampler(Sampler[StepKey]):
    """The steps of one epoch: ``ceil(n_tasks / tasks_per_step)`` keys, each ``(task indices, episode
    indices)``, drawn from a permutation seeded by ``(seed, epoch)``; the last step wraps around to
    the start of the permutation. Lightning calls :meth:`set_epoch`; without it each pass over the
    sampler advances the epoch by one.

    Args:
        n_tasks: tasks to cycle through.
        tasks_per_step: tasks per step.
        n_episodes: grounded episodes to cycle through (0: none).
        episodes_per_step: grounded episodes per step.
        seed: the base seed.
    """

    def __init__(self, n_tasks: int, tasks_per_step: int, n_episodes: int, episodes_per_step: int, seed: int = 0):
        self.n_tasks, self.tasks_per_step = n_tasks, tasks_per_step
        self.n_episodes, self.episodes_per_step = n_episodes, episodes_per_step
        self.seed, self.epoch = seed, 0
        self.skip = 0

    def resume_at(self, step: int) -> None:
        """The next pass starts at the ``step``-th step of the run (``step % len(self)`` into its epoch),
        where a run interrupted after ``step`` steps stopped: the keys are a pure function of
        ``(seed, epoch, position)``, so the resumed run reads what the uninterrupted one would have."""
        self.skip = step % len(self)

    def __len__(self) -> int:
        return math.ceil(self.n_tasks / self.tasks_per_step)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[StepKey]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        self.epoch += 1
        steps, k = len(self), self.tasks_per_step
        order = _permutation_stream(self.n_tasks, self.n_tasks, gen)
        order += order[: steps * k - len(order)]
        sft = _permutation_stream(self.n_episodes, steps * self.episodes_per_step, gen)
        e = self.episodes_per_step if self.n_episodes else 0
        start, self.skip = self.skip, 0
        for s in range(start, steps):
            yield tuple(order[s * k : (s + 1) * k]), tuple(sft[s * e : (s + 1) * e])


class StepLoader(DataLoader[StepBatch]):
    """The training loader, resumable: Lightning stores :meth:`state_dict` in every checkpoint and
    hands it to :meth:`load_state_dict` on ``--ckpt_path``, so a resumed run continues with the step
    the interrupted one would have taken next instead of re-reading its epoch from the start.

    Args:
        dataset: the training steps' dataset.
        sampler: the seeded order of steps.
        position: steps taken so far (the trainer's ``global_step``: one optimizer step per batch).
        num_workers: DataLoader worker processes.
    """

    def __init__(self, dataset: StepDataset, sampler: StepSampler, position: Callable[[], int], num_workers: int = 0):
        super().__init__(dataset, sampler=sampler, batch_size=None, collate_fn=as_step_batch, num_workers=num_workers)
        self.steps, self.position = sampler, position

    def state_dict(self) -> dict[str, int]:
        return {"step": self.position(), "steps_per_epoch": len(self.steps), "seed": self.steps.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        mine = {"steps_per_epoch": len(self.steps), "seed": self.steps.seed}
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(
                f"the checkpoint's data order {theirs} is not this run's {mine}: same data and seed needed"
            )
        self.steps.resume_at(int(state["step"]))


class StepDataset(Dataset[StepBatch]):
    """Turns a :data:`StepKey` into a :class:`StepBatch` (tasks as they are, episodes padded, the pool
    handed on).

    Args:
        tasks: the tasks the keys index.
        episodes: the tokenised grounded episodes the keys index.
        pad_id: padding token id.
        pool: what every batch carries for RL to draw more tasks from (training only; by reference).
    """

    def __init__(self, tasks: list[Task], episodes: list[EpisodeTensors], pad_id: int, pool: TaskPool | None = None):
        self.tasks, self.episodes, self.pad_id, self.pool = tasks, episodes, pad_id, pool

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, key: StepKey) -> StepBatch:  # type: ignore[override]
        task_idx, episode_idx = key
        sft = collate_episodes([self.episodes[i] for i in episode_idx], self.pad_id) if episode_idx else None
        return StepBatch(tasks=[self.tasks[i] for i in task_idx], sft=sft, pool=self.pool)


def as_step_batch(item: Any) -> StepBatch:
    """The collate function (``batch_size=None``: one item is one step, already a StepBatch)."""
    if not isinstance(item, StepBatch):
        raise TypeError(f"expected a StepBatch, got {type(item).__name__}")
    return item
