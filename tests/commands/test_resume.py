"""``--ckpt_path last`` resumes the run whatever the logger's versioning, or refuses in one line; it
never trains from step 0 silently (issue 30: a numbered logger gave every fit a new, empty folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.cli import lightning_cli, main
from envace.commands.errors import UsageError
from envace.commands.resume import resolve_last

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
TINY = ["--model.init_args.policy.name_or_path", "tiny", "--trainer.precision", "32-true"]


def _trainer(work: Path, config: str, *extra: str):
    """The trainer a config builds (the tiny model in place of its policy), in ``work``."""
    before = os.getcwd()
    os.chdir(work)
    try:
        return lightning_cli(["--config", str(ROOT / config), *TINY, *extra], run=False).trainer
    finally:
        os.chdir(before)


def _touch(path: Path, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _resolve(work: Path, trainer) -> Path:
    """The checkpoint ``last`` resolves to, as an absolute path."""
    before = os.getcwd()
    os.chdir(work)
    try:
        return (work / resolve_last(trainer)).resolve()
    finally:
        os.chdir(before)


@pytest.mark.parametrize(
    ("config", "folder"),
    [  # every shipped base config: where its ModelCheckpoint writes, and so where last is found
        ("configs/smoke.yaml", "runs/smoke/version_{}/checkpoints"),  # numbered logger versions
        ("configs/bfcl.yaml", "runs/bfcl/envace/checkpoints"),  # a fixed version (the arm)
        ("configs/tau2.yaml", "runs/tau2/envace/checkpoints"),
        ("configs/bfcl_sft.yaml", "runs/bfcl_sft/checkpoints"),  # an explicit dirpath
    ],
)
def test_shipped_configs_resolve_last_or_refuse(tmp_path: Path, config: str, folder: str) -> None:
    trainer = _trainer(tmp_path, config)
    with pytest.raises(UsageError, match=r"^--ckpt_path last: nothing to resume, no checkpoint at ") as info:
        _resolve(tmp_path, trainer)  # nothing written yet: one line naming the folder, not a fresh start
    assert folder.format("*") + "/last.ckpt" in str(info.value)
    if "{}" in folder:  # version_0 and version_2 have one, version_3 (the newest) none: the newest that has one
        _touch(tmp_path / folder.format(0) / "last.ckpt", mtime=1.0)
        want = _touch(tmp_path / folder.format(2) / "last.ckpt", mtime=2.0)
        (tmp_path / folder.format(3) / "checkpoints").mkdir(parents=True)
        trainer = _trainer(tmp_path, config)  # a new fit: the logger's next version (4), still empty
        assert str(trainer.checkpoint_callback.dirpath or "") == ""
    else:
        want = _touch(tmp_path / folder / "last.ckpt")
        _touch(tmp_path / "runs" / "other" / "version_9" / "checkpoints" / "last.ckpt")  # another run: never taken
    assert _resolve(tmp_path, trainer) == want.resolve()


def test_an_arm_is_never_resumed_from_another_arms_checkpoint(tmp_path: Path) -> None:
    _touch(tmp_path / "runs/bfcl/real_env/checkpoints/last.ckpt")
    trainer = _trainer(tmp_path, "configs/bfcl.yaml", "--config", str(ROOT / "configs/arms/envace.yaml"))
    with pytest.raises(UsageError, match="runs/bfcl/envace/checkpoints/last.ckpt"):
        _resolve(tmp_path, trainer)


@pytest.mark.parametrize(
    ("logger", "folder"),
    [  # a user's config: an unversioned CSV logger; no logger at all
        ("{class_path: lightning.pytorch.loggers.CSVLogger, init_args: {save_dir: logs, name: mine}}",
         "logs/mine/version_{}/checkpoints"),
        ("false", "runs/checkpoints"),
    ],
)  # fmt: skip
def test_an_unversioned_logger_resumes_its_newest_version(tmp_path: Path, logger: str, folder: str) -> None:
    trainer = _trainer(tmp_path, "configs/smoke.yaml", "--trainer.logger", logger)
    with pytest.raises(UsageError, match="nothing to resume"):
        _resolve(tmp_path, trainer)
    want = _touch(tmp_path / folder.format(1) / "last.ckpt")
    if "{}" in folder:
        _touch(tmp_path / folder.format(0) / "last-v1.ckpt")  # older version, newer file name: not taken
    assert _resolve(tmp_path, _trainer(tmp_path, "configs/smoke.yaml", "--trainer.logger", logger)) == want.resolve()


def test_nothing_to_resume_is_one_line_and_exit_2(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--config", SMOKE, "--ckpt_path", "last"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    want = "envace fit: error: --ckpt_path last: nothing to resume, no checkpoint at runs/smoke/version_*/checkpoints/"
    assert err[-2].startswith(want), err
    assert not list(tmp_path.rglob("*.ckpt"))


def _fit(cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "envace.cli", "fit", "--config", SMOKE, *extra]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two fits of the smoke config (about a minute on two cores)
def test_the_issue_sequence_resumes_at_step_4(tmp_path: Path) -> None:
    """``envace fit --config configs/smoke.yaml`` (4 steps, its logger numbers versions), then the same
    with ``--trainer.max_steps 6 --ckpt_path last``: restored at step 4 from version_0, 2 more steps."""
    first = _fit(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    last = Path("runs/smoke/version_0/checkpoints/last.ckpt")
    resumed = _fit(tmp_path, "--trainer.max_steps", "6", "--ckpt_path", "last")
    log = resumed.stderr + resumed.stdout
    assert resumed.returncode == 0, log[-3000:]
    assert f"envace: --ckpt_path last -> {last}" in log and f"Restored all states from the checkpoint at {last}" in log
    assert "no last checkpoint available" not in log and "`max_steps=6` reached" in log
    import torch

    assert torch.load(tmp_path / last, weights_only=False)["global_step"] == 4
    assert torch.load(tmp_path / "runs/smoke/version_1/checkpoints/last.ckpt", weights_only=False)["global_step"] == 6
