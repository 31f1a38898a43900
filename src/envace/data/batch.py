"""Padded token batches shared by the warm start and the RL update."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from envace.protocol.tokens import EpisodeTensors
from envace.types import Task


class TokenBatch(NamedTuple):
    """Right-padded episodes, all ``[B, T]``.

    Attributes:
        input_ids: token ids; pad positions hold ``pad_id``.
        attention_mask: 1 on real tokens.
        roles: role id per token (0 context, 1 act, 2 rehearse); 0 on padding.
        loss_mask: 1 on policy-written tokens; 0 on context and padding.
        logprobs: sampling log-probs of policy-written tokens; 0 elsewhere.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    roles: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(*(t.to(device) for t in self))


def collate_episodes(episodes: list[EpisodeTensors], pad_id: int) -> TokenBatch:
    """Right-pad episodes into one :class:`TokenBatch`.

    >>> t = torch.tensor
    >>> e = EpisodeTensors(t([5, 6]), t([0, 1]), t([0.0, -1.0]), t([0.0, 1.0]))
    >>> b = collate_episodes([e, EpisodeTensors(*(t[:1] for t in e))], pad_id=0)
    >>> b.input_ids.tolist(), b.attention_mask.tolist(), b.loss_mask.tolist()
    ([[5, 6], [5, 0]], [[1, 1], [1, 0]], [[0.0, 1.0], [0.0, 0.0]])
    """
    width = max(len(e.input_ids) for e in episodes)
    n = len(episodes)
    out = TokenBatch(
        input_ids=torch.full((n, width), pad_id, dtype=torch.long),
        attention_mask=torch.zeros((n, width), dtype=torch.long),
        roles=torch.zeros((n, width), dtype=torch.long),
        loss_mask=torch.zeros((n, width)),
        logprobs=torch.zeros((n, width)),
    )
    for row, e in enumerate(episodes):
        k = len(e.input_ids)
        out.input_ids[row, :k] = e.input_ids
        out.attention_mask[row, :k] = 1
        out.roles[row, :k] = e.roles
        out.loss_mask[row, :k] = e.loss_mask
        out.logprobs[row, :k] = e.logprobs
    return out


class TaskPool(NamedTuple):
    """The training tasks RL rolls out, for a step that needs more than its own: dynamic sampling
    (``EnvACEModule.dynamic_sampling``) draws fresh tasks from it. The DataModule hands it to the
    training steps inside their :class:`StepBatch` (validation batches carry none).

    Attributes:
        tasks: RL's training tasks (the DataModule's ``train_set``), by reference.
        seed: the data order's seed (the DataModule's ``data_seed``).
    """

    tasks: Sequence[Task]
    seed: int

    def draws(self, step: int) -> Callable[[int], list[Task]]:
        """Draws of ``count`` tasks (with replacement) at optimizer step ``step``: one random stream
        per step, seeded by ``(seed, step)``, so a resumed run draws what the uninterrupted one would.

        >>> pool = TaskPool([Task(str(i), "x") for i in range(10)], seed=0)
        >>> first, again = pool.draws(step=3), pool.draws(step=3)
        >>> [t.id for t in first(3)] == [t.id for t in again(3)], len(first(2))
        (True, 2)
        """
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return lambda count: [self.tasks[int(i)] for i in torch.randint(len(self.tasks), (count,), generator=gen)]


class StepBatch:
    """What one training step receives: tasks to roll out (RL) and/or grounded episodes (warm start),
    and, in training, the pool RL may draw more tasks from (:class:`TaskPool`).

    Not a dataclass on purpose: before any hook, Lightning's ``bf16-true``/``16-true`` precision maps
    over every dataclass of a batch (deep-copying each :class:`Task` and failing on its frozen fields)
    and casts its float tensors (the recorded log-probs) to 16 bits. A plain object passes through;
    :meth:`EnvACEDataModule.transfer_batch_to_device` moves the token tensors as they are.
    """

    __slots__ = ("pool", "sft", "tasks")

    def __init__(self, tasks: list[Task], sft: TokenBatch | None = None, pool: TaskPool | None = None) -> None:
        self.tasks, self.sft, self.pool = tasks, sft, pool

    def __repr__(self) -> str:
        return f"StepBatch(tasks={[t.id for t in self.tasks]}, sft={None if self.sft is None else 'TokenBatch'})"
