"""What a benchmark gives the evaluation loop, and what the loop records per item.

A :class:`Benchmark` loads its tasks, says who answers committed calls (its real environment, a
replay, or the policy's world model), who plays the user, what its oracle writes, how one committed
episode is scored, and how item scores aggregate into table rows.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from envace.evaluation.policies import Policy
from envace.inference import ImaginedTurn, TokenCounts, token_counts
from envace.rewards.base import RewardOutput
from envace.rollout import Episode, RolloutLimits
from envace.rollout.loop import UserHook, scripted_user
from envace.rollout.reference import calls_once_per_turn, gold_calls
from envace.rollout.responders import Responder
from envace.rollout.transcript import segments
from envace.types import ROLE_IDS, Task


@dataclass
class TaskFilter:
    """Which tasks of a benchmark to evaluate.

    Args:
        categories: the benchmark's categories to run (BFCL categories, tau2 or VitaBench domains);
            default: every category it can score offline.
        split: the source's split (BFCL multi-turn ``all``/``test``/``train``, tau2 ``test``/``all``, ...);
            default: the benchmark's evaluation set (BFCL ``all``, tau2 ``test``).
        limit: at most this many tasks per category (the first ones, in the source's order).
        task_ids: only these task ids.
        max_user_turns: cut multi-turn tasks to their first turns (:meth:`~envace.types.Task.first_turns`).
        path: the data folder of sources that read one (VitaBench, chat logs; BFCL/tau2 optional).
    """

    categories: list[str] | None = None
    split: str | None = None
    limit: int | None = None
    task_ids: list[str] | None = None
    max_user_turns: int | None = None
    path: str | None = None

    def apply(self, tasks: list[Task]) -> list[Task]:
        """Filter ``tasks`` (ids, then ``limit`` per category) and cut their turns."""
        if self.task_ids is not None:
            wanted = set(self.task_ids)
            tasks = [t for t in tasks if t.id in wanted]
        if self.limit is not None:
            seen: dict[str, int] = {}
            kept = []
            for t in tasks:
                seen[t.category] = seen.get(t.category, 0) + 1
                if seen[t.category] <= self.limit:
                    kept.append(t)
            tasks = kept
        return [t.first_turns(self.max_user_turns) for t in tasks]


@dataclass
class ItemResult:
    """One committed episode of one task under one imagination setting and trial; ``texts``: what the
    policy wrote in it, one decoded string per act turn (special tokens kept)."""

    benchmark: str
    category: str
    task_id: str
    mode: str
    n: int
    trial: int
    score: float | None
    success: bool
    tokens: TokenCounts
    details: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)
    turns: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    imagination: list[dict[str, Any]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def item_result(
    bench: str, episode: Episode, out: RewardOutput, category: str, mode: str, n: int, trial: int
) -> ItemResult:
    """The record of one scored committed episode (its calls and the imagination that preceded each turn)."""
    return ItemResult(
        benchmark=bench,
        category=category,
        task_id=episode.task.id,
        mode=mode,
        n=n,
        trial=trial,
        score=out.score,
        success=bool(out.success),
        tokens=token_counts(episode),
        details=out.details,
        flags=sorted(episode.flags),
        turns=episode.turn + 1,
        calls=[c.to_dict() for c in episode.calls],
        imagination=[imagined_record(r) for r in episode.imagined],
        texts=act_texts(episode),
    )


def imagined_record(turn: ImaginedTurn) -> dict[str, Any]:
    """One imagination before (or, revised, within) a committed user turn, as ``items.jsonl`` keeps it."""
    return {"turn": turn.turn, "memory_tokens": turn.memory_tokens, "at_call": turn.at_call, "revised": turn.revised,
            "attempts": [a.to_dict() for a in turn.attempts]}  # fmt: skip


def act_texts(episode: Episode) -> list[str]:
    """The policy's act turns of ``episode``, decoded (special tokens kept: the raw text it wrote)."""
    decode = episode.builder.encode.tokenizer.decode
    return [decode(ids, skip_special_tokens=False) for role, ids in segments(episode) if role == ROLE_IDS["act"]]


@dataclass
class Summary:
    """One aggregate of a benchmark: ``metric`` of ``category`` is ``value`` over ``items``."""

    category: str
    metric: str
    value: float
    items: list[ItemResult]


def mean(values: list[float]) -> float:
    """The mean, 0.0 for no values."""
    return sum(values) / len(values) if values else 0.0


def by_category(items: list[ItemResult]) -> dict[str, list[ItemResult]]:
    """Items grouped by category, in first-seen order."""
    out: dict[str, list[ItemResult]] = {}
    for it in items:
        out.setdefault(it.category, []).append(it)
    return out


class Benchmark(ABC):
    """A benchmark as the evaluation loop sees it.

    Args:
        filter: which tasks to run.
    """

    name: ClassVar[str]
    #: the table's headline metric (plotted against the number of imagined attempts)
    headline: ClassVar[str] = "success"

    def __init__(self, filter: TaskFilter):
        self.filter = filter

    @abstractmethod
    def tasks(self) -> list[Task]:
        """The tasks to evaluate (filtered)."""

    def category(self, task: Task) -> str:
        return task.category

    def limits(self, category: str, limits: RolloutLimits) -> RolloutLimits:
        """The episode limits of ``category`` (default: the configured ones)."""
        return limits

    @contextmanager
    def prepared(
        self, category: str, tasks: list[Task], run: Callable[[list[Task]], list[Episode]]
    ) -> Iterator[list[Task]]:
        """Run what ``category``'s tasks depend on (``run``: the evaluation's rollout; those episodes
        are not scored) and yield the tasks to run and score; undone on exit. Default: nothing to run.
        """
        yield tasks

    @abstractmethod
    def responder(self, policy: Policy) -> Responder:
        """Who answers committed calls."""

    def imagine(self, policy: Policy) -> Responder | None:
        """Who answers imagined calls (``None``: the policy's own rehearsal)."""
        return None

    def user(self, policy: Policy) -> UserHook:
        """Who writes the user turns (default: the task's scripted turns)."""
        return scripted_user

    def oracle(self, episode: Episode) -> str:
        """What the ``oracle`` policy writes at this act step (default: the turn's gold calls in one
        step, then a closing text)."""
        return calls_once_per_turn(episode, gold_calls(episode))

    @abstractmethod
    def score(self, episode: Episode) -> RewardOutput:
        """The benchmark's score of one committed episode."""

    @abstractmethod
    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        """Table rows of one imagination setting: per category, then aggregates."""

    def notes(self) -> list[str]:
        """Caveats printed under the table (partial aggregates, proxies)."""
        return []
