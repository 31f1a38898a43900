"""End to end on CPU with a 2-layer model: warm start then RL in one fit, logging, checkpoints,
resume (also after SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from envace.cli import lightning_cli
from envace.modules import EnvACEModule

from .test_learning import even_share

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real fits of the smoke config, minutes each on two cores


SMOKE = str(ROOT / "configs" / "smoke.yaml")


def _fit(tmp: Path, *extra: str):
    before = os.getcwd()
    os.chdir(tmp)  # the config's relative runs/ folder (events and checkpoints) lands in tmp
    try:
        return lightning_cli(["fit", "--config", SMOKE, *extra])
    finally:
        os.chdir(before)


def _scalars(run_dir: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for f in run_dir.rglob("events.out.tfevents*"):
        ea = EventAccumulator(str(f))
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in ea.Scalars(tag))
    return out


def test_fit_warm_start_then_rl_logs_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a reward the tiny model's groups vary on: with the tiny model's all-zero rewards the RL gradient is 0, and
    # the resumed steps below could only move the adapters through optimizer state left from earlier steps
    monkeypatch.setattr(EnvACEModule, "reward", even_share)
    lora = ["--model.init_args.policy.lora", "{r: 4, target_modules: [q_proj, v_proj]}"]
    cli = _fit(tmp_path, *lora, "--model.init_args.rl_lr_scale", "0.5", "--model.init_args.loss_chunk_tokens", "64")
    assert cli.trainer.global_step == 4  # the module steps by hand (chunked backward): one step per batch
    assert cli.trainer.optimizers[0].param_groups[0]["lr"] == 0.5e-3  # and the schedule follows the RL phase
    tags = _scalars(tmp_path)
    assert len(tags["train/sft/loss"]) >= 2 and len(tags["train/rl/loss"]) >= 2  # 2 warm-start + 2 RL steps
    for key in ("train/reward/all", "train/rl/reward/group_std", "train/rollout/act_tokens",
                "val/imagined/fidelity/pairs", "val/imagined/fidelity_gold/pairs", "val/imagined/proxy_score/all",
                "val/committed/official_success/bfcl", "val/committed/proxy_score/bfcl", "val/committed/proxy_gap/bfcl",
                "val/committed/turn_score/bfcl", "train/rollout/tokens_per_s",
                "train/official/disagree/all", "train/rl/kl"):  # fmt: skip
        assert key in tags, key
    last = next(tmp_path.rglob("last.ckpt"))
    saved = torch.load(last, weights_only=False)["state_dict"]
    assert saved and all("lora_" in k for k in saved)  # LoRA checkpoints keep the trainable weights only
    assert {k.split(".", 1)[0] for k in saved} == {"policy", "reference"}  # and the frozen warm start's (KL)
    state = {k: v for k, v in saved.items() if k.startswith("policy.")}
    from envace.policy import PolicySpec, load_checkpoint

    reloaded = dict(load_checkpoint(PolicySpec("tiny"), str(last)).named_parameters())  # weights_only load
    assert all(torch.equal(reloaded[k.removeprefix("policy.")], v) for k, v in state.items())
    resumed = _fit(tmp_path, *lora, "--trainer.max_steps", "6", "--ckpt_path", str(last))
    assert resumed.trainer.global_step == 6
    adapters = dict(resumed.model.policy.named_parameters())
    changed = [k for k, v in state.items() if not torch.equal(adapters[k.removeprefix("policy.")], v)]
    assert changed, "two more RL steps after resuming must move the restored adapters"


RESUME = """
model:
  init_args:
    policy: {lora: {r: 4, target_modules: [q_proj, v_proj]}}
    loss:  # the KL term makes the RL gradient depend on the sampled episodes (the tiny model's rewards are all 0)
      class_path: envace.losses.RoleGRPOLoss
      init_args: {kl_coef: 0.1}
trainer:
  max_steps: 5
  val_check_interval: 1000
  callbacks:
    - class_path: envace.callbacks.RolloutLogger
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {dirpath: ckpt, save_last: true, every_n_train_steps: 1, save_top_k: -1}
"""


def _run(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "envace.cli", "fit", "--config", SMOKE, "--config", str(cwd.parent / "resume.yaml")]
    return subprocess.run([*cmd, *extra], cwd=cwd, capture_output=True, text=True, timeout=600)


def _killed_after(cwd: Path, step: int) -> Path:
    """A run SIGKILLed once its step-``step`` checkpoint exists; that checkpoint."""
    cmd = [sys.executable, "-m", "envace.cli", "fit", "--config", SMOKE, "--config", str(cwd.parent / "resume.yaml"),
           "--trainer.max_steps", "200"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    try:
        while time.time() < deadline and not list(cwd.rglob(f"epoch=*-step={step + 1}.ckpt")):
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return next(cwd.rglob(f"epoch=*-step={step}.ckpt"))


def _trained(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, weights_only=True)["state_dict"]


def test_a_killed_run_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    """SIGKILL at step k (k = 1: in the warm start; k = 3: in RL), resume with ``--ckpt_path``: the
    weights after step 5 equal the uninterrupted run's exactly (fp32): same batches (without the
    stateful loader k = 1 fails), same episodes (without the checkpoint's RNG states k = 3 fails)."""
    (tmp_path / "resume.yaml").write_text(RESUME)
    whole = tmp_path / "whole"
    whole.mkdir()
    run = _run(whole)
    assert run.returncode == 0, run.stderr[-3000:]
    want = _trained(next(whole.rglob("epoch=*-step=5.ckpt")))
    for k in (1, 3):
        cwd = tmp_path / f"killed-{k}"
        cwd.mkdir()
        ckpt = _killed_after(cwd, k)
        resumed = _run(cwd, "--ckpt_path", str(ckpt))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        log = resumed.stderr + resumed.stdout
        assert f"Restored all states from the checkpoint at {ckpt}" in log and "`max_steps=5` reached" in log
        assert "not resumable" not in log  # the training loader is stateful
        got = _trained(next(p for p in cwd.rglob("epoch=*-step=5.ckpt")))
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert torch.equal(got[name], value), f"killed at step {k}: {name} differs after resuming"


def test_a_fit_that_stops_between_two_saves_leaves_its_final_weights_last(tmp_path: Path) -> None:
    """3 steps, a save every 2: ``last.ckpt`` holds step 3, not step 2 (Lightning alone keeps step 2's:
    how ShopWorld's 124-step warm start of gate 2 was first recorded at 120 steps)."""
    cli = _fit(tmp_path, "--trainer.max_steps", "3", "--trainer.val_check_interval", "3")
    assert cli.trainer.global_step == 3
    (last,) = tmp_path.rglob("last.ckpt")
    assert torch.load(last, weights_only=False)["global_step"] == 3
