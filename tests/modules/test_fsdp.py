"""FSDP2 through Lightning's ModelParallelStrategy on two CPU processes (gloo): the same code path as
configs/fsdp/8gpu.yaml, with rollouts inside the step and a sharded checkpoint that resumes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_VARS = ("LOCAL_RANK", "NODE_RANK", "GLOBAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "PL_TRAINER_GPUS", "GROUP_RANK")  # fmt: skip
pytestmark = [
    pytest.mark.slow,  # two fits in two spawned processes each
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed gloo"),
]


def _fit(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "envace.cli", "fit", "--config", str(ROOT / "configs" / "smoke.yaml"), "--config",
           str(ROOT / "configs" / "fsdp" / "cpu2.yaml"), *extra]  # fmt: skip
    # a launcher's variables left in this process by another test would make the fit take itself for a
    # launched rank and wait for a peer that never starts: the fit gets the environment a user's shell has
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=600, env=env)


def test_two_process_fsdp_trains_and_resumes_from_a_sharded_checkpoint(tmp_path: Path) -> None:
    first = _fit(tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "Starting with 2 processes" in first.stderr + first.stdout
    last = next(tmp_path.rglob("last.ckpt"))
    assert last.is_dir() and any(last.glob("*.distcp")), "FSDP2 writes a sharded (distributed) checkpoint"
    assert (last / "meta.pt").is_file(), "rank 0 writes the non-tensor state (loop progress) beside the shards"
    assert torch.load(last / "meta.pt", weights_only=False)["global_step"] == 4
    second = _fit(tmp_path, "--trainer.max_steps", "6", "--ckpt_path", str(last))
    assert second.returncode == 0, second.stderr[-4000:]
    assert "Restored all states" in second.stderr + second.stdout
    assert "`max_steps=6` reached" in second.stderr + second.stdout
