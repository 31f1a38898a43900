"""A reward that raises is a bug: it stops ``fit`` with a message naming the step, the task and the
reward (the traceback chained); a reward that cannot be computed masks the episode instead."""

from __future__ import annotations

from pathlib import Path

import pytest

import envace.rewards
from envace.cli import lightning_cli
from envace.rewards import RewardError, RewardOutput, RewardUnavailable, compute_reward
from envace.types import Task, Trajectory

SMOKE = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")


def _bug(task: Task, traj: Trajectory) -> RewardOutput:
    return RewardOutput({"gold": 1}["golden"])  # a KeyError: the kind of slip a reward can have


def _outage(task: Task, traj: Trajectory) -> RewardOutput:
    raise RewardUnavailable("judge endpoint unreachable")


def test_a_declared_outage_masks_and_a_bug_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    task = Task("t1", "tau2")
    monkeypatch.setattr(envace.rewards, "get_reward", lambda name: _outage)
    out = compute_reward(task, Trajectory(task, []))
    assert out.masked and "unreachable" in out.details["error"]
    monkeypatch.setattr(envace.rewards, "get_reward", lambda name: _bug)
    with pytest.raises(RewardError, match=r"reward 'tau2' raised on task 't1': KeyError") as info:
        compute_reward(task, Trajectory(task, []))
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.slow
def test_a_reward_bug_stops_fit_naming_step_task_and_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envace.rewards, "get_reward", lambda name: _bug)
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", SMOKE, "--model.init_args.warm_start_steps", "1", "--trainer.max_steps", "3",
            "--trainer.limit_val_batches", "0"]  # fmt: skip
    with pytest.raises(RewardError) as info:
        lightning_cli(args)
    message = str(info.value)
    assert message.startswith("step 1: reward 'bfcl-multi-turn' raised on task 'multi_turn_base_")
    assert "KeyError" in message and isinstance(info.value.__cause__, KeyError)
