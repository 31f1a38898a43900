"""configs/shopworld.yaml end to end with a 2-layer model, under each arm the study's gates run
(studies/shopworld/rules.yaml): the warm start grounds sft episodes; RL rolls out the rl split under
rehearsal (envace), against the real world (real_env) or beside a frozen simulator (simulator), or the
warm start goes on instead (sft_only); validation scores tune tasks with gold-writes and logs
decision-relevant fidelity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envace.cli import lightning_cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model.init_args.policy.name_or_path", "tiny", "--data.limit", "8", "--model.init_args.warm_start_steps",
        "2", "--trainer.max_steps", "3", "--trainer.val_check_interval", "3", "--data.val_tasks", "5",
        "--data.tasks_per_step", "2", "--model.init_args.group_size", "2", "--model.init_args.limits.max_new_tokens",
        "24", "--model.init_args.limits.max_rehearse_tokens", "24", "--trainer.precision", "32-true",
        "--trainer.num_sanity_val_steps", "0"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["envace", "real_env", "simulator", "sft_only"])
def test_shopworld_fits_under_every_arm_of_its_gates(tmp_path: Path, arm: str) -> None:
    arms = ["--config", str(ROOT / f"configs/arms/{arm}.yaml")]
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        cli = lightning_cli(["fit", "--config", str(ROOT / "configs/shopworld.yaml"), *arms, *TINY])
    finally:
        os.chdir(before)
    assert cli.trainer.global_step == 3
    assert {t.extra["split"] for t in cli.datamodule.train_set} == {"rl"}
    events = next(tmp_path.rglob("events.out.tfevents*"))
    ea = EventAccumulator(str(events))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"val/committed/proxy_success/shopworld", "val/imagined/fidelity_gold/decision_f1/shopworld"} <= tags
    assert ("train/reward/all" in tags) == (arm != "sft_only")  # sft_only rolls nothing out
