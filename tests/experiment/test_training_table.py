"""The report's training numbers from curves whose values the test sets: first and last thirds, the
largest KL, means over steps and over runs, the official checker's disagreement weighted by the
episodes it scored, and tasks gained and lost against the warm start."""

from __future__ import annotations

import pytest

from envace.experiment.results import Run
from envace.experiment.training_table import (
    ACT_TOKENS,
    CLIP,
    DISAGREE,
    FORMAT_ERRORS,
    KL,
    OFFICIAL_ONLY,
    REWARD,
    REWARD_ONLY,
    SCORED,
    SUCCESS,
    TRUNCATION,
    ZERO_GROUPS,
    Agreement,
    gained_lost,
    moving_average,
    thirds,
    training_row,
)


def _curve(*values: float) -> list[tuple[int, float]]:
    return list(enumerate(values))


def _run(seed: int, curves: dict[str, list[tuple[int, float]]]) -> Run:
    cost = {"act_tokens": 0, "rehearse_tokens": 0, "env_calls": 0, "generated_tokens": 0}
    return Run(arm="a", seed=seed, seconds=1.0, steps=6, cost=cost, curves=curves)


def _official(scored: list[float], reward_only: list[float], official_only: list[float]) -> dict:
    disagree = [r + o for r, o in zip(reward_only, official_only, strict=True)]
    return {
        SCORED: _curve(*scored),
        DISAGREE: _curve(*disagree),
        REWARD_ONLY: _curve(*reward_only),
        OFFICIAL_ONLY: _curve(*official_only),
    }


def test_thirds_are_the_first_and_last_third_of_the_steps_in_step_order() -> None:
    # 7 steps: k = 7 // 3 = 2 points each side; the middle three are in neither
    assert thirds([(6, 12.0), (0, 0.0), (1, 2.0), (2, 100.0), (3, 100.0), (4, 100.0), (5, 10.0)]) == (1.0, 11.0)
    assert thirds([(0, 0.5), (1, 0.7)]) == (0.5, 0.7)  # fewer than 3 steps: the first and the last point
    assert thirds([]) is None


def test_a_training_row_is_the_mean_over_runs_of_each_runs_numbers() -> None:
    run0 = {
        REWARD: _curve(0.0, 0.2, 0.4, 0.4, 0.6, 0.8),  # first third (0.0 + 0.2) / 2 = 0.1, last (0.6 + 0.8) / 2 = 0.7
        SUCCESS: _curve(0.0, 0.0, 0.5, 0.5, 1.0, 1.0),  # 0.0 → 1.0
        KL: _curve(0.0, 0.01, 0.05, 0.02, 0.03, 0.04),  # max 0.05
        ZERO_GROUPS: _curve(0.5, 0.5, 0.25, 0.25, 0.75, 0.75),  # mean 0.5
        CLIP: _curve(0.0, 0.0, 0.0, 0.0, 0.0, 0.06),  # mean 0.01
        FORMAT_ERRORS: _curve(0.4, 0.2, 0.1, 0.1, 0.0, 0.0),  # 0.3 → 0.0
        TRUNCATION: _curve(0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        ACT_TOKENS: _curve(40.0, 50.0, 60.0, 60.0, 70.0, 80.0),  # mean 60
    }
    run1 = {
        REWARD: _curve(0.2, 0.4, 0.4, 0.6, 0.8, 1.0),  # 0.3 → 0.9
        SUCCESS: _curve(0.5, 0.5, 0.5, 0.5, 0.5, 0.5),  # 0.5 → 0.5
        KL: _curve(0.0, 0.03, 0.01, 0.02, 0.01, 0.01),  # max 0.03
        ZERO_GROUPS: _curve(0.0, 0.0, 0.0, 0.0, 0.0, 0.0),  # mean 0
        CLIP: _curve(0.03, 0.03, 0.03, 0.03, 0.03, 0.03),  # mean 0.03
        FORMAT_ERRORS: _curve(0.1, 0.1, 0.1, 0.1, 0.1, 0.1),  # 0.1 → 0.1
        TRUNCATION: _curve(0.1, 0.1, 0.1, 0.1, 0.1, 0.1),
        # no ACT_TOKENS: this run is left out of that cell's mean
    }
    row = training_row("a", [_run(0, run0), _run(1, run1)])
    assert row.runs == 2
    assert row.reward == pytest.approx((0.2, 0.8), abs=1e-12)  # (0.1 + 0.3) / 2, (0.7 + 0.9) / 2
    assert row.success == pytest.approx((0.25, 0.75), abs=1e-12)
    assert row.kl_max == pytest.approx(0.04, abs=1e-12)  # (0.05 + 0.03) / 2
    assert row.zero_groups == pytest.approx(0.25, abs=1e-12)
    assert row.clip == pytest.approx(0.02, abs=1e-12)
    assert row.format_errors == pytest.approx((0.2, 0.05), abs=1e-12)
    assert row.truncation == pytest.approx(0.05, abs=1e-12)
    assert row.act_tokens == pytest.approx(60.0, abs=1e-12)
    assert row.agreement is None  # neither run logged train/official/*


def test_the_official_disagreement_is_weighted_by_scored_episodes_and_pooled_over_runs() -> None:
    # run 0: 16 + 8 scored; reward-only 1/16 of 16 = 1 episode; official-only 2/16·16 + 1/8·8 = 3 episodes
    run0 = _official([16.0, 8.0], [1 / 16, 0.0], [2 / 16, 1 / 8])
    # run 1: 8 scored, 2 reward-only; run 2 has no train/official/* curves (an older file): left out
    run1 = _official([8.0], [2 / 8], [0.0])
    row = training_row("a", [_run(0, run0), _run(1, run1), _run(2, {REWARD: _curve(0.5)})])
    assert row.agreement == pytest.approx(Agreement(scored=32.0, disagree=6.0, reward_only=3.0, official_only=3.0))
    assert row.agreement is not None and row.agreement.share == pytest.approx(6 / 32)  # not the mean of shares


def test_a_run_without_train_curves_gives_none_everywhere() -> None:
    row = training_row("a", [_run(0, {"val/committed/official_success/all": _curve(0.3, 0.4)})])
    assert row.runs == 1
    assert set(vars(row).values()) == {"a", 1, None}
    assert training_row("a", []).reward is None  # an arm without runs


def test_gained_and_lost_count_the_tasks_moved_each_way_on_shared_tasks() -> None:
    warm = {"val/a": 1.0, "val/b": 0.0, "val/c": 0.0, "val/d": 1.0, "test/a": 1.0}
    policy = {"val/a": 0.0, "val/b": 1.0, "val/c": 0.0, "val/d": 1.0, "test/a": 1.0, "test/z": 1.0}
    g = gained_lost(warm, policy)
    # test/z has no warm-start value: not counted; b gained, a lost; pass counts 3 and 3 hide both
    assert (g.tasks, g.warm_passes, g.passes, g.gained, g.lost) == (5, 3.0, 3.0, 1, 1)


def test_tasks_moved_are_also_counted_by_scenario() -> None:
    # the three categories of BFCL scenario 59 lost together are one family; 7's base gained is another
    warm = {f"val/multi_turn_{c}_59": 1.0 for c in ("base", "miss_param", "miss_func")} | {"val/multi_turn_base_7": 0.0}
    policy = dict.fromkeys(warm, 0.0) | {"val/multi_turn_base_7": 1.0}
    g = gained_lost(warm, policy)
    assert (g.gained, g.lost, g.gained_families, g.lost_families) == (1, 3, 1, 1)


def test_moving_average_is_trailing_over_the_window() -> None:
    assert moving_average([4.0, 0.0, 8.0, 4.0, 4.0, 0.0], 4) == [4.0, 2.0, 4.0, 4.0, 4.0, 4.0]
