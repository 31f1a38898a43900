"""``scripts/grid_driver.sh`` on a throwaway repository, with a stand-in ``envace`` that writes a unit's
result file: a unit lands as a commit, and a later pin that tracks the results an earlier pin left
untracked in the worktree still checks out (gate 3's and #51's drivers once aborted there)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_ENVACE = """#!/usr/bin/env bash
# envace experiment --config C --unit U: write U's result file and the grid's metadata, as the runner does
set -eu
unit=${@: -1}
mkdir -p res/units && echo "{\\"unit\\": \\"$unit\\"}" > "res/units/$unit.json" && echo '{}' > res/experiment.json
"""

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("flock") is None, reason="needs git, flock")


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def _repo(tmp: Path) -> Path:
    main = tmp / "main"
    (main / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "grid_driver.sh", main / "scripts" / "grid_driver.sh")
    (main / "x.yaml").write_text("name: x\nresults: res\n")
    (main / ".venv" / "bin").mkdir(parents=True)
    (main / ".venv" / "bin" / "envace").write_text(FAKE_ENVACE)
    (main / ".venv" / "bin" / "envace").chmod(0o755)
    (main / ".gitignore").write_text(".venv/\n")
    _git(main, "init", "-q", "-b", "main")
    _git(main, "add", ".")
    _git(main, "commit", "-qm", "start")
    return main


def _drive(main: Path, pin: str, unit: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENVACE_LOCK": str(main.parent / "lock"), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["bash", "scripts/grid_driver.sh", "x.yaml", pin, unit], cwd=main, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_unit_lands_as_a_commit_and_a_later_pin_that_tracks_earlier_results_checks_out(tmp_path: Path) -> None:
    main = _repo(tmp_path)
    first = _git(main, "rev-parse", "HEAD").strip()
    done = _drive(main, first, "u1")
    assert done.returncode == 0, done.stderr
    assert "x: u1" in _git(main, "log", "-1", "--format=%s") and (main / "res/units/u1.json").is_file()

    later = _git(main, "rev-parse", "HEAD").strip()  # tracks res/units/u1.json, untracked in the worktree
    done = _drive(main, later, "u2")
    assert done.returncode == 0, done.stderr
    assert _git(main, "log", "-1", "--format=%s").strip() == "x: u2"
    assert sorted(p.name for p in (main / "res/units").iterdir()) == ["u1.json", "u2.json"]
