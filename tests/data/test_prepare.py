"""``envace data prepare/verify``: datasets that load back, and all-or-nothing writes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envace.data.prepare as prep
from envace._bfcl import bfcl_data_dir
from envace.data.grounding import ground
from envace.data.prepare import data_main, prepare, save_atomic
from envace.data.sources import load_source
from envace.data.sources.bfcl import RecordError
from envace.data.sources.prepared import RowError, features, read_prepared, read_row, task_row, trajectory_row
from envace.types import CallRecord, Message, Task, ToolCall, Trajectory


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
    assert ds.features == features(grounded=True) and len(ds) == 3  # typed columns, not JSON blobs
    row = ds[0]
    assert row["messages"][0] == {"role": "system", "content": "", "tool_calls": [], "name": None}
    assert row["messages"][1]["role"] == "user" and row["messages"][2]["role"] == "assistant"
    call = row["messages"][2]["tool_calls"][0]
    assert call == {"type": "function", "function": row["gold"][0][0]}  # {name, arguments: JSON text}
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert row["messages"][3] == {**row["messages"][3], "role": "tool", "name": call["function"]["name"]}
    assert [t["name"] for t in row["tools"]] == [json.loads(t["schema"])["name"] for t in row["tools"]]
    # lossless: every row reads back to the task and trajectory that were written
    originals = load_source("bfcl-multi-turn", split="train")[:3]
    assert read_prepared(out) == [(t, ground(t)) for t in originals]
    assert json.loads((out / "prepared.json").read_text()) == {
        "source": "bfcl-multi-turn", "split": "train", "path": None, "limit": 3, "grounded": True, "rows": 3,
        "left_out": [],
    }  # fmt: skip
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


# ------------------------------------------------------------------ the prepared format, round trip

_text = st.text(max_size=8)
_scalar = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats(allow_nan=False, allow_infinity=False)
_json = st.recursive(
    _scalar | _text, lambda c: st.lists(c, max_size=3) | st.dictionaries(_text, c, max_size=3), max_leaves=8
)
_object = st.dictionaries(_text, _json, max_size=4)
_call = st.builds(ToolCall, _text, _object)
_tool = (
    st.fixed_dictionaries({"name": _text}, optional={"description": _text, "parameters": _object})
    | st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": _text})})
    | _object  # whatever a source holds: the name and description fields are "" then
)
_tasks = st.builds(
    Task,
    id=st.text(min_size=1, max_size=8),
    benchmark=_text,
    category=_text,
    system_prompt=st.text(max_size=20),
    tools=st.lists(_tool, max_size=3),
    user_turns=st.lists(_text, max_size=3),
    gold=st.lists(st.lists(_call, max_size=2), max_size=3),
    tools_added=st.dictionaries(st.integers(0, 9).map(str), st.lists(_tool, max_size=2), max_size=2),
    user_sim=st.none() | _object,
    env=st.none() | _object,
    recorded=st.lists(st.builds(CallRecord, _call, _json), max_size=2),
    extra=_object,
)
_messages = st.lists(
    st.builds(
        Message, st.sampled_from(["system", "user", "assistant", "tool"]), _text, st.lists(_call, max_size=2),
        st.none() | _text,
    ),
    max_size=4,
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=_tasks, messages=_messages, calls=st.lists(st.builds(CallRecord, _call, _json), max_size=2),
       source=_text, grounded=st.booleans())  # fmt: skip
def test_rows_read_back_to_equal_tasks_and_trajectories(task, messages, calls, source, grounded):
    traj = Trajectory(task, messages, calls, source) if grounded else None
    row = task_row(task) | (trajectory_row(traj, task) if traj else {})
    stored = datasets.Dataset.from_list([row], features=features(grounded))[0]  # through Arrow and back
    assert read_row("ds", 0, stored) == (task, traj)


def test_a_value_json_cannot_hold_is_refused_when_writing():
    with pytest.raises(ValueError, match=r"task 't': extra: cannot be written as JSON: .*not a finite number"):
        task_row(Task("t", "x", extra={"a": float("nan")}))
    with pytest.raises(ValueError, match=r"task 't': gold\[0\]\[0\]\.arguments: cannot be written as JSON"):
        task_row(Task("t", "x", gold=[[ToolCall("f", {"a": "\ud800"})]]))
    with pytest.raises(ValueError, match="tools_added: key '01' is not a turn number"):
        task_row(Task("t", "x", tools_added={"01": []}))
    with pytest.raises(ValueError, match="task 't': cannot be written: a string holds an unpaired surrogate"):
        task_row(Task("t", "x", user_turns=["\udc80"]))


# ------------------------------------------------------------------ edited and broken folders

QUOTE = {
    "name": "quote",
    "description": "A price.",
    "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}},
}


def _conversation(i: int) -> tuple[Task, Trajectory]:
    call = ToolCall("quote", {"symbol": f"S{i}"})
    task = Task(f"t{i}", "chatlog", system_prompt="Be brief.", tools=[QUOTE], user_turns=["Price?"], gold=[[call]],
                recorded=[CallRecord(call, {"price": 1.5})])  # fmt: skip
    messages = [Message("user", "Price?"), Message("assistant", "", [call]),
                Message("tool", '{"price": 1.5}', name="quote"), Message("assistant", "1.5")]  # fmt: skip
    return task, Trajectory(task, messages, list(task.recorded), "recorded")


def _folder(path: Path, edit=None) -> Path:
    rows = [task_row(t) | trajectory_row(tr, t) for t, tr in map(_conversation, range(3))]
    if edit is not None:
        edit(rows)
    save_atomic(datasets.Dataset.from_list(rows, features=features(True)), path, manifest={"split": "train"})
    return path


def _set(path: tuple, value):
    """An edit of row 1 at ``path`` (keys and indices, as the error names them)."""

    def edit(rows):
        *parents, last = path
        target = rows[1]
        for key in parents:
            target = target[key]
        target[last] = value

    return edit


EDITS = [
    (("messages", 2, "tool_calls", 0, "function", "arguments"), "{oops",
     r"row 1: messages\[2\]\.tool_calls\[0\]\.function\.arguments: not valid JSON: Expecting property name"),
    (("messages", 1, "role"), "robot", r"row 1: messages\[1\]\.role: 'robot' is not one of system, user"),
    (("messages", 2, "tool_calls", 0, "type"), "fn", r"messages\[2\]\.tool_calls\[0\]\.type: expected 'function'"),
    (("messages", 0, "content"), "Be long.", r"row 1: messages\[0\]: must be the system message, repeating system_p"),
    (("tools", 0, "name"), "qoute", r"tools\[0\]\.name: 'qoute' is not the name in tools\[0\]\.schema \('quote'\)"),
    (("tools", 0, "schema"), '{"name": "quote", "description": "A price."', r"tools\[0\]\.schema: not valid JSON"),
    (("gold", 0, 0, "arguments"), "[1]", r"row 1: gold\[0\]\[0\]\.arguments: expected a JSON object, got \[1\]"),
    (("recorded", 0, "response"), '{"price": NaN}', r"recorded\[0\]\.response: not valid JSON: NaN is not a JSON"),
    (("extra",), '{"n": ' + "9" * 5000 + "}", r"row 1: extra: not valid JSON: an integer of 5000 digits"),
    (("id",), "t0", r"row 1: id: 't0' repeats row 0"),
    (("id",), "", r"row 1: id: empty"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "value", "says"), EDITS, ids=[".".join(map(str, p)) for p, *_ in EDITS])
def test_an_edited_row_is_one_error_naming_folder_row_and_field(tmp_path, path, value, says):
    folder = _folder(tmp_path / "ds", _set(path, value))
    with pytest.raises(RowError, match=says) as err:
        read_prepared(folder)
    assert str(err.value).startswith(f"{folder}: row 1: ") and "\n" not in str(err.value)


def test_broken_folders_are_one_line_errors(tmp_path):
    good = _folder(tmp_path / "good")
    assert [t for t, _ in read_prepared(good)] == [_conversation(i)[0] for i in range(3)]
    with pytest.raises(RecordError, match=r"nope: no such folder"):
        read_prepared(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RecordError, match=r"plain: not a dataset folder \(FileNotFoundError"):
        read_prepared(tmp_path / "plain")
    narrow = tmp_path / "narrow"
    datasets.load_from_disk(str(good)).remove_columns(["tools", "extra"]).save_to_disk(str(narrow))
    with pytest.raises(RecordError, match=r"narrow: missing column\(s\) tools, extra: not a prepared dataset"):
        read_prepared(narrow)
    damaged = tmp_path / "damaged"
    shutil.copytree(good, damaged)
    arrow = next(damaged.glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:200])
    with pytest.raises(RecordError, match=r"damaged: not a dataset folder \("):
        read_prepared(damaged)
    with pytest.raises(ValueError, match=r"good: prepared from split 'train', asked for 'test'"):
        load_source("prepared", split="test", path=str(good))
    with pytest.raises(ValueError, match="source 'prepared' needs path"):
        load_source("prepared", split="train")


def test_an_edited_folder_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    from envace.cli import main

    folder = _folder(tmp_path / "ds", _set(("messages", 1, "role"), "robot"))
    capsys.readouterr()
    args = ["data", "prepare", "--source", "prepared", "--split", "train", "--path", str(folder)]
    assert main([*args, "--out", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    roles = "system, user, assistant, tool"
    assert err.startswith("envace data: error: ") and len(err.strip().splitlines()) == 1  # one line, no traceback
    assert f"{folder}: row 1: messages[1].role: 'robot' is not one of {roles}" in err
    good = _folder(tmp_path / "good")  # a prepared folder is a source like any other: prepared again, cut
    assert main([*args[:-1], str(good), "--out", str(tmp_path / "cut"), "--limit", "2"]) == 0
    assert [t.id for t, _ in read_prepared(tmp_path / "cut")] == ["t0", "t1"]


# ------------------------------------------------------------------ fit trains from what prepare wrote


@pytest.mark.slow  # a real fit of the smoke config: about 15 s on two cores
def test_fit_trains_from_a_prepared_folder(tmp_path):
    import torch

    from envace.cli import lightning_cli
    from envace.policy import PolicySpec, load_model

    out = tmp_path / "mt"
    prepare("bfcl-multi-turn", "train", str(out), limit=4, grounded=True)
    smoke = str(Path(__file__).resolve().parents[2] / "configs" / "smoke.yaml")
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        cli = lightning_cli(["fit", "--config", smoke, "--data.sources", f"[{{name: prepared, path: {out}}}]",
                             "--data.val_sources", "[]", "--trainer.max_steps", "2",
                             "--trainer.enable_checkpointing", "false", "--trainer.callbacks", "[]"])  # fmt: skip
    finally:
        os.chdir(before)
    data = cli.datamodule
    assert cli.trainer.global_step == 2  # the two warm-start steps, on the prepared tasks' grounded episodes
    assert {t.id for t in data.train_set} <= {t.id for t, _ in read_prepared(out)}
    assert data.counts["train_loaded"] == 4 and data.train_set and len(data.episodes) > 0
    fresh = dict(load_model(PolicySpec("tiny")).named_parameters())  # the weights fit started from
    trained = dict(cli.model.policy.named_parameters())
    assert any(not torch.equal(fresh[k], v.detach().cpu()) for k, v in trained.items())  # the steps moved them
