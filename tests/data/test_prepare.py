"""``envace data prepare/verify``: datasets that load back, and all-or-nothing writes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

import envace.data.prepare as prep
from envace._bfcl import bfcl_data_dir
from envace.data.prepare import data_main, prepare
from envace.data.sources.bfcl import RecordError
from envace.types import Task, Trajectory


def mini_bfcl(root: Path, n: int = 3) -> Path:
    """A data folder with the first ``n`` multi_turn_base records and the class docs."""
    src = bfcl_data_dir()
    (root / "possible_answer").mkdir(parents=True)
    shutil.copytree(src / "multi_turn_func_doc", root / "multi_turn_func_doc")
    for category in ("base", "miss_func", "miss_param", "long_context"):
        for sub in ("", "possible_answer/"):
            name = f"{sub}BFCL_v4_multi_turn_{category}.json"
            (root / name).write_text("\n".join((src / name).read_text().splitlines()[:n]) + "\n")
    return root


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> str:
    return str(mini_bfcl(tmp_path_factory.mktemp("bfcl")))


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_prepare_writes_a_grounded_dataset_that_loads_back(tmp_path):
    out = tmp_path / "prepared" / "mt"
    assert data_main(["prepare", "--source", "bfcl-multi-turn", "--split", "train", "--out", str(out),
                      "--limit", "3", "--grounded", "true"]) == 0  # fmt: skip
    ds = datasets.load_from_disk(str(out))
    assert ds.column_names == ["id", "benchmark", "category", "task_json", "trajectory_json"] and len(ds) == 3
    task = Task.from_json(ds[0]["task_json"])
    assert task.id == ds[0]["id"] and task.extra["split"] == "train" and task.gold
    traj = Trajectory.from_json(ds[0]["trajectory_json"])
    assert [r.call for r in traj.calls] == [c for turn in task.gold for c in turn]
    assert leftovers(out.parent) == ["mt"]  # no temporary folder left behind


def test_an_existing_output_is_kept_unless_overwrite(tmp_path, mini):
    out = tmp_path / "ds"
    prepare("bfcl-multi-turn", "all", str(out), path=mini, limit=1)
    with pytest.raises(FileExistsError):
        prepare("bfcl-multi-turn", "all", str(out), path=mini, limit=2)
    assert len(datasets.load_from_disk(str(out))) == 1
    prepare("bfcl-multi-turn", "all", str(out), path=mini, limit=2, overwrite=True)
    assert len(datasets.load_from_disk(str(out))) == 2 and leftovers(tmp_path) == ["ds"]


def test_a_failure_midway_leaves_nothing(tmp_path, monkeypatch, mini):
    out = tmp_path / "ds"
    seen = []

    def flaky_ground(task):
        seen.append(task.id)
        if len(seen) == 2:
            raise RuntimeError("boom")
        return real_ground(task)

    real_ground = prep.ground
    monkeypatch.setattr(prep, "ground", flaky_ground)
    with pytest.raises(RuntimeError, match="boom"):
        prepare("bfcl-multi-turn", "all", str(out), path=mini, limit=3, grounded=True)
    assert leftovers(tmp_path) == []


def test_a_failing_save_leaves_nothing(tmp_path, monkeypatch, mini):
    def half_save(self, path, **kw):
        Path(path).mkdir(parents=True)
        (Path(path) / "data-00000-of-00001.arrow").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", half_save)
    with pytest.raises(OSError, match="disk full"):
        prepare("bfcl-multi-turn", "all", str(tmp_path / "ds"), path=mini, limit=2)
    assert leftovers(tmp_path) == []


def test_bad_path_and_malformed_records_write_nothing(tmp_path):
    out = tmp_path / "out" / "ds"
    with pytest.raises(FileNotFoundError, match="nope"):
        data_main(
            [
                "prepare",
                "--source",
                "bfcl-multi-turn",
                "--split",
                "all",
                "--path",
                str(tmp_path / "nope"),
                "--out",
                str(out),
            ]
        )
    root = mini_bfcl(tmp_path / "bfcl")
    assert (
        data_main(["prepare", "--source", "bfcl-multi-turn", "--split", "all", "--path", str(root), "--out", str(out)])
        == 0
    )
    assert len(datasets.load_from_disk(str(out))) == 12
    broken = root / "possible_answer" / "BFCL_v4_multi_turn_miss_param.json"
    lines = broken.read_text().splitlines()
    lines[2] = lines[2].replace('"ground_truth"', '"truth"')
    broken.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=r"BFCL_v4_multi_turn_miss_param\.json:3: ground_truth: missing"):
        prepare("bfcl-multi-turn", "all", str(tmp_path / "other"), path=str(root))
    assert not (tmp_path / "other").exists()


def test_verify_prints_groups_and_total(capsys):
    assert data_main(["verify", "--source", "bfcl-multi-turn", "--limit", "1"]) == 0
    printed = capsys.readouterr().out
    assert "multi_turn_base" in printed and "total" in printed and "4/4" in printed


# ------------------------------------------------------------------ untrusted input through the CLI

DEEP = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"


def _prepare_args(path: Path, out: Path) -> list[str]:
    return ["data", "prepare", "--source", "chatlog", "--split", "all", "--path", str(path), "--out", str(out)]


@pytest.mark.parametrize(
    ("data", "says"),
    [(b"", ": no records (the file is empty)"), (DEEP, ":1: unusable JSON value: nested deeper than 512 levels")],
)
def test_bad_chatlogs_print_one_line_and_exit_2(tmp_path, capsys, data: bytes, says: str):
    from envace.cli import main

    path, out = tmp_path / "logs.jsonl", tmp_path / "ds"
    path.write_bytes(data)
    assert main(_prepare_args(path, out)) == 2
    assert capsys.readouterr().err == f"envace data: error: {path}{says}\n"
    assert not out.exists()


def test_the_console_shows_one_line_not_a_traceback(tmp_path):
    path, out = tmp_path / "logs.jsonl", tmp_path / "ds"
    path.write_bytes(DEEP)  # once a RecursionError traceback, exit 1
    run = subprocess.run(
        [sys.executable, "-m", "envace.cli", *_prepare_args(path, out)], capture_output=True, text=True, timeout=300
    )
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines() == [
        f"envace data: error: {path}:1: unusable JSON value: nested deeper than 512 levels"
    ]


def test_no_tasks_or_limit_0_is_an_error(tmp_path):
    path = tmp_path / "logs.jsonl"
    path.write_text(json.dumps({"split": "test", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match=r"logs\.jsonl: no record has split 'train'"):
        prepare("chatlog", "train", str(tmp_path / "ds"), path=str(path))
    with pytest.raises(ValueError, match="limit must be at least 1"):
        prepare("chatlog", "all", str(tmp_path / "ds"), path=str(path), limit=0)
    assert leftovers(tmp_path) == ["logs.jsonl"]
