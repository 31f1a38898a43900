"""The optimizer at the RL boundary: RL that follows the warm start in the same fit starts as a fit
started from the warm start's weights does, with a fresh AdamW and its own warm-up. Before the fix the
one-fit path carried the warm start's Adam moments into RL and skipped RL's warm-up, so the two paths
took different first RL steps from the same weights (docs/training.md; issue #50)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from envace.cli import lightning_cli
from envace.modules import EnvACEModule
from envace.policy import PolicySpec

from .test_learning import even_share

ROOT = Path(__file__).resolve().parents[2]
LORA = "{r: 4, target_modules: [q_proj, v_proj]}"


class SeedAtRL(pl.Callback):
    """Reseeds every generator as the first RL step starts, so both paths sample the same episodes."""

    def on_train_batch_start(self, trainer: pl.Trainer, module: Any, batch: Any, i: int) -> None:
        if module.phase_at(trainer.global_step) == "rl" and not getattr(self, "done", False):
            self.done = True
            random.seed(7)
            torch.manual_seed(7)


def _fit(tmp: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> Any:
    monkeypatch.setattr(EnvACEModule, "reward", even_share)  # a reward the tiny model's groups vary on
    before = os.getcwd()
    os.chdir(tmp)
    try:
        args = ["--config", str(ROOT / "configs/smoke.yaml"), "--model.init_args.policy.lora", LORA,
                "--model.init_args.optim.warmup_steps", "2", "--model.init_args.group_size", "4",
                "--data.limit", "1", "--trainer.limit_val_batches", "0", "--trainer.logger", "false",
                "--trainer.callbacks", "[]", *extra]  # fmt: skip
        cli = lightning_cli(args, run=False)
        cli.trainer.callbacks.append(SeedAtRL())
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        return cli
    finally:
        os.chdir(before)


def _adapters(module: EnvACEModule) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_one_fit_and_a_fit_from_the_warm_start_take_the_same_first_rl_step(tmp_path, monkeypatch) -> None:
    ckpt = tmp_path / "ws" / "warm.ckpt"
    (tmp_path / "ws").mkdir()
    warm = _fit(tmp_path / "ws", monkeypatch, "--model.init_args.warm_start_steps", "2", "--trainer.max_steps", "2",
                "--trainer.enable_checkpointing", "false")  # fmt: skip
    warm.trainer.save_checkpoint(ckpt)
    (tmp_path / "one").mkdir()
    one = _fit(tmp_path / "one", monkeypatch, "--model.init_args.warm_start_steps", "2", "--trainer.max_steps", "3",
               "--trainer.enable_checkpointing", "false")  # fmt: skip
    (tmp_path / "two").mkdir()
    two = _fit(tmp_path / "two", monkeypatch, "--model.init_args.warm_start_steps", "0", "--trainer.max_steps", "1",
               "--model.init_args.policy.checkpoint", str(ckpt), "--trainer.enable_checkpointing", "false")  # fmt: skip
    start = _adapters(warm.model)
    a, b = _adapters(one.model), _adapters(two.model)
    assert any(not torch.equal(a[k], start[k]) for k in a)  # the RL step moved the weights
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-7)


def test_rl_counts_its_own_warm_up_from_its_first_step() -> None:
    module = EnvACEModule(policy=PolicySpec("tiny"), warm_start_steps=3, rl_lr_scale=0.5)
    module.optim.warmup_steps = 2
    factors = [module.lr_factor(s) for s in range(6)]
    assert factors == [0.5, 1.0, 1.0, 0.25, 0.5, 0.5]  # warm start 1/2, 1; RL 0.5 x (1/2, 1)
    module.warm_start_only = True  # sft_only: every step is a warm-start step
    assert [module.lr_factor(s) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]
