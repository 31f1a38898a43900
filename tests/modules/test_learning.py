"""A guard that RL learns at all: a few GRPO steps of the real training path (``envace fit`` of the
smoke config: rollout, reward, role-wise advantages, the clipped surrogate, the chunked update) on a
task a 2-layer random model can learn raise its reward, and the same run with the advantage's sign
flipped lowers it. Cheap, so that CI catches a broken update direction (bfcl_cpu's RL arms all fell
below their warm start; an inverted sign would look the same from outside)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import envace.losses.grpo as grpo
from envace.cli import lightning_cli
from envace.modules import EnvACEModule
from envace.rewards import RewardOutput
from envace.types import ROLE_IDS

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


def even_share(self: EnvACEModule, episode: Any) -> RewardOutput:
    """The learnable task: the share of the episode's act tokens whose id is even (about 1/2 for a
    random model, and every group has variance)."""
    acts = [i for i, r in zip(episode.builder.ids, episode.builder.roles, strict=True) if r == ROLE_IDS["act"]]
    score = sum(i % 2 == 0 for i in acts) / max(len(acts), 1)
    return RewardOutput(score, score > 0.5)


class Rewards(pl.Callback):
    def __init__(self) -> None:
        self.per_step: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, out: Any, batch: Any, i: int):
        self.per_step.append(sum(r.score for r in out["rewards"]) / len(out["rewards"]))


def rewards_of_a_short_run(tmp: Path, monkeypatch: pytest.MonkeyPatch, flip: bool) -> list[float]:
    monkeypatch.setattr(EnvACEModule, "reward", even_share)
    if flip:
        unflipped = grpo.token_advantages
        monkeypatch.setattr(grpo, "token_advantages", lambda adv, roles: -unflipped(adv, roles))
    before = os.getcwd()
    os.chdir(tmp)
    try:
        args = ["--config", str(ROOT / "configs/smoke.yaml"), "--model.init_args.warm_start_steps", "0",
                "--model.init_args.group_size", "8", "--model.init_args.optim.lr", "1e-2",
                "--model.init_args.limits.max_new_tokens", "8", "--model.init_args.sampling.temperature", "0.1",
                "--data.limit", "2", "--trainer.max_steps",
                str(STEPS), "--trainer.limit_val_batches", "0", "--trainer.enable_checkpointing", "false",
                "--trainer.callbacks", "[]", "--trainer.logger", "false"]  # fmt: skip
        cli = lightning_cli(args, run=False)
        seen = Rewards()
        cli.trainer.callbacks.append(seen)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        os.chdir(before)
    assert len(seen.per_step) == STEPS
    return seen.per_step


def rise(rewards: list[float]) -> float:
    """Mean reward of the last three steps less that of the first three."""
    return sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3


def test_grpo_steps_raise_the_reward_of_a_learnable_task(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    rewards = rewards_of_a_short_run(tmp_path, monkeypatch, flip=False)
    assert rise(rewards) > 0.15, rewards


def test_the_same_steps_with_the_advantage_sign_flipped_lower_it(tmp_path, monkeypatch) -> None:
    """What the guard above catches: the update direction inverted (it fails the test above)."""
    torch.manual_seed(0)
    rewards = rewards_of_a_short_run(tmp_path, monkeypatch, flip=True)
    assert rise(rewards) < -0.15, rewards
