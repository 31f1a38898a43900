"""The clinic example (examples/clinic_mcp): its committed tasks are what ``make_tasks.py`` writes, the
splits are disjoint and balanced, held-out doctors appear in test only, and the real server's five
tools answer, carry ids from one call to the next and fail with their reason as declared."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from envace.data.sources import load_source
from envace.data.sources.tasks import schema_problem
from envace.envs.base import make_environment
from envace.types import ToolCall

CLINIC = Path(__file__).resolve().parents[2] / "examples" / "clinic_mcp"
KINDS = {"slots", "book", "tests", "reschedule", "cancel"}
ENV = {"kind": "mcp", "server": {"command": sys.executable, "args": [str(CLINIC / "server.py")]}}


def _rows(folder: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]


def _doctors(row: dict) -> set[str]:
    return {c["arguments"]["doctor"] for c in row["gold"][0] if "doctor" in c["arguments"]}


def test_the_committed_tasks_are_what_the_generator_writes(tmp_path: Path) -> None:
    for out in (tmp_path / "a", tmp_path / "b"):  # twice: deterministic, not only equal to the files once
        subprocess.run(
            [sys.executable, "make_tasks.py", "--out", str(out)],
            cwd=CLINIC,
            check=True,
            capture_output=True,
            timeout=60,
        )
    for split in ("train", "val", "test"):
        written = (tmp_path / "a" / f"{split}.jsonl").read_text()
        assert (
            written
            == (tmp_path / "b" / f"{split}.jsonl").read_text()
            == (CLINIC / "tasks" / f"{split}.jsonl").read_text()
        )


def test_splits_are_disjoint_and_hold_every_kind_in_equal_shares() -> None:
    rows = {split: _rows(CLINIC / "tasks", split) for split in ("train", "val", "test")}
    assert [len(r) for r in rows.values()] == [210, 45, 45]
    ids = [r["id"] for split in rows.values() for r in split]
    assert len(ids) == len(set(ids))
    for split, items in rows.items():
        kinds = Counter(r["metadata"]["category"] for r in items)
        assert set(kinds) == KINDS and max(kinds.values()) - min(kinds.values()) <= 1, (split, kinds)
    held = {d for r in rows["test"] for d in _doctors(r)} - {d for r in rows["train"] for d in _doctors(r)}
    assert held == {"dr-gupta", "dr-hale"} and not any(_doctors(r) & held for r in rows["val"])
    unseen = Counter(r["metadata"]["category"] for r in rows["test"] if _doctors(r) & held)
    assert set(unseen) == KINDS, unseen


@pytest.fixture(scope="module")
def clinic():
    """One stdio clinic server (one session) and its listed tools, as a fit's tasks source lists them."""
    task = load_source("tasks", split="val", path=str(CLINIC / "tasks"), env=ENV)[0]
    env = make_environment(task)
    assert env is not None
    yield task.tools, env
    env.close()


def test_the_tools_are_listed_with_a_ref_array_schema_that_resolves(clinic) -> None:
    tools, _ = clinic
    assert [t["name"] for t in tools] == [
        "find_slots",
        "book_appointment",
        "order_tests",
        "reschedule_appointment",
        "cancel_appointment",
    ]
    order_tests = next(t for t in tools if t["name"] == "order_tests")["parameters"]
    assert order_tests["properties"]["tests"] == {
        "items": {"$ref": "#/$defs/LabTest"},
        "title": "Tests",
        "type": "array",
    }
    assert all(schema_problem(t) is None for t in tools)


def test_ids_carry_from_one_call_to_the_next_and_unknown_ones_fail_with_their_reason(clinic) -> None:
    _, env = clinic
    booked = env.execute(
        ToolCall("book_appointment", {"doctor": "dr-chen", "day": "monday", "time": "09:00", "patient": "Ana Lima"})
    )
    vid = booked["appointment_id"]
    assert vid.startswith("V") and booked["status"] == "booked"
    assert "09:00" not in env.execute(ToolCall("find_slots", {"doctor": "dr-chen", "day": "monday"}))["free"]
    tests = [{"code": "CBC", "fasting": True}, {"code": "ECG"}]
    assert env.execute(ToolCall("order_tests", {"appointment_id": vid, "tests": tests})) == {
        "appointment_id": vid,
        "tests": ["CBC", "ECG"],
        "fasting": True,
    }
    moved = env.execute(ToolCall("reschedule_appointment", {"appointment_id": vid, "day": "friday", "time": "16:00"}))
    assert (moved["day"], moved["time"], moved["status"]) == ("friday", "16:00", "rescheduled")
    assert env.execute(ToolCall("cancel_appointment", {"appointment_id": vid})) == {
        "appointment_id": vid,
        "status": "cancelled",
    }
    for call, reason in [
        (ToolCall("cancel_appointment", {"appointment_id": "V999"}), "no appointment 'V999'"),
        (ToolCall("order_tests", {"appointment_id": vid, "tests": [{"code": "XRAY"}]}), "unknown test codes"),
        (ToolCall("find_slots", {"doctor": "dr-nobody", "day": "monday"}), "unknown doctor"),
    ]:
        error = env.execute(call)["error"]
        assert error["code"] == "TOOL_ERROR" and reason in error["message"], error  # the ToolError's own text
