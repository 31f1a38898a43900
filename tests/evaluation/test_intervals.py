"""The stratified task bootstrap: through the benchmark's own aggregation, tasks kept apart when
drawn twice, category sizes fixed, one seed one interval."""

from __future__ import annotations

from envace.evaluation.base import ItemResult, Summary, mean
from envace.evaluation.intervals import bootstrap_interval
from envace.inference import TokenCounts


def _item(task: str, success: bool, category: str = "c", trial: int = 0) -> ItemResult:
    return ItemResult("b", category, task, "none", 0, trial, float(success), success, TokenCounts(0, 0, 0, 0))


def _accuracy(items: list[ItemResult]) -> list[Summary]:
    return [Summary("c", "accuracy", mean([float(it.success) for it in items]), items)]


def test_all_or_nothing_gives_a_point_and_a_half_gives_the_binomial_spread() -> None:
    wins = [_item(f"t{i}", True) for i in range(10)]
    assert bootstrap_interval(_accuracy, wins, "accuracy", "c") == (1.0, 1.0, 1000)
    half = [_item(f"t{i}", i % 2 == 0) for i in range(10)]
    lo, hi, reps = bootstrap_interval(_accuracy, half, "accuracy", "c", seed=3)
    # the mean of 10 draws of a fair coin: sd 0.158, so the 95 % percentile interval is about 0.2..0.8
    assert reps == 1000 and 0.1 <= lo <= 0.3 and 0.7 <= hi <= 0.9
    assert bootstrap_interval(_accuracy, half, "accuracy", "c", seed=3) == (lo, hi, reps)
    assert bootstrap_interval(_accuracy, [], "accuracy", "c") is None
    assert bootstrap_interval(_accuracy, half, "accuracy", "other") is None


def test_a_task_drawn_twice_stays_two_tasks_and_categories_keep_their_size() -> None:
    """Two trials per task; a statistic over distinct task ids (as tau2's pass^k groups by task) must
    see 3 + 7 tasks in every replicate, with both trials of each."""
    items = [_item(f"{c}{i}", True, c, trial) for c, k in (("a", 3), ("b", 7)) for i in range(k) for trial in (0, 1)]

    def tasks(sample: list[ItemResult]) -> list[Summary]:
        per: dict[str, set[str]] = {}
        for it in sample:
            per.setdefault(it.category, set()).add(it.task_id)
        trials = {(it.task_id, it.trial) for it in sample}
        return [Summary(c, "tasks", len(ids), sample) for c, ids in per.items()] + [
            Summary("[all]", "records", len(trials), sample)
        ]

    assert bootstrap_interval(tasks, items, "tasks", "a", n_boot=200) == (3.0, 3.0, 200)
    assert bootstrap_interval(tasks, items, "tasks", "b", n_boot=200) == (7.0, 7.0, 200)
    assert bootstrap_interval(tasks, items, "records", "[all]", n_boot=200) == (20.0, 20.0, 200)
