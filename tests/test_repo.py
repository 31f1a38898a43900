"""The repository itself: no tracked file is over 5 MB, so that no clone pays for weights forever
(released policies live in the cache's store, their records in git: docs/experiment.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 5 * 1024 * 1024
#: the files over the limit committed before the rule, each in history for good (removing one from the
#: tree does not shrink a clone): the bfcl_cpu_v2/tune warm starts' kept fp32 weights, which
#: runner.ensure_checkpoint restores from, and bfcl_cpu_v2's released adapters in the old layout. The
#: list only shrinks: a path that leaves the tree must leave it too.
LEGACY = {
    "docs/experiments/bfcl_cpu_tune3/checkpoints/warm_start.ckpt",
    "docs/experiments/bfcl_cpu_tune4/checkpoints/warm_start.ckpt",
    "docs/experiments/bfcl_cpu_v2/checkpoints/warm_start.ckpt",
    *(
        f"docs/experiments/bfcl_cpu_v2/policies/{unit}/adapter_model.safetensors"
        for unit in (
            "warm_start",
            "run-envace-s1",
            "run-real_env-s1",
            "run-simulator-s1",
            "run-sft_only-s0",
            "run-sft_only-s1",
        )
    ),
}


def large_files(root: Path, limit: int = LIMIT) -> dict[str, int]:
    """The files git tracks under ``root`` that are over ``limit`` bytes (path -> size); a tracked file
    deleted from the work tree is not counted."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
    sizes = {name: (root / name).stat().st_size for name in listed.decode().split("\0") if (root / name).is_file()}
    return {name: size for name, size in sizes.items() if size > limit}


def _git_checkout(root: Path) -> bool:
    probe = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return probe.returncode == 0 and Path(probe.stdout.strip()).resolve() == root


def test_no_tracked_file_is_over_5_mb() -> None:
    if not _git_checkout(ROOT):
        pytest.skip("not a git checkout")
    large = large_files(ROOT)
    new = {name: size for name, size in large.items() if name not in LEGACY}
    assert not new, f"tracked files over 5 MB (keep weights in the cache, commit their record): {new}"
    gone = sorted(LEGACY - set(large))
    assert not gone, f"no longer tracked or no longer over 5 MB: remove from LEGACY {gone}"


def test_a_large_tracked_file_shows(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "small.json").write_text("{}")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 2048)
    (tmp_path / "ignored.bin").write_bytes(b"\0" * 2048)  # not tracked: not counted
    subprocess.run(["git", "-C", str(tmp_path), "add", "small.json", "weights.bin"], check=True)
    assert large_files(tmp_path, limit=1024) == {"weights.bin": 2048}
