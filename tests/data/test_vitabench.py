"""VitaBench tasks from a user-supplied folder: fields, required orders, and errors that name file and field."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from envace.data.sources import load_source
from envace.data.sources.vitabench import load_vitabench
from envace.protocol.parse import validate_call
from envace.types import Task, ToolCall

# the data folder is the `vitabench_data` fixture (tests/conftest.py): skipped where it is absent


@pytest.fixture(scope="module")
def tasks(vitabench_data: Path) -> list[Task]:
    return load_vitabench(path=str(vitabench_data))


def test_counts_and_fields(tasks: list[Task]) -> None:
    assert Counter(t.category for t in tasks) == {"delivery": 100, "instore": 100}
    assert len({t.id for t in tasks}) == 200
    task = next(t for t in tasks if t.id == "10711001")
    assert task.benchmark == "vitabench" and task.env is None and task.gold == [] and task.user_turns == []
    assert "2025-06-21 11:20:00" in task.system_prompt and "delivery" in task.system_prompt
    assert task.user_sim["profile"]["user id"] == "U000001"
    assert task.user_sim["instructions"].startswith("It's pouring rain outside")
    assert [o["order_id"] for o in task.extra["required_orders"]] == ["10711001T01"]
    assert task.extra["user_id"] == "U000001" and task.extra["initial_orders"] == {}
    assert "create_delivery_order" in task.extra["write_tools"] and "get_nearby" not in task.extra["write_tools"]
    assert all("x-vita" not in t for t in task.tools)
    call = ToolCall(
        "create_delivery_order",
        {
            "user_id": "U1",
            "store_id": "S",
            "product_ids": ["P"],
            "product_cnts": [1],
            "address": "a",
            "dispatch_time": "t",
        },
    )
    assert validate_call(call, task.tools) is None
    assert Task.from_json(task.to_json()) == task


def test_required_orders_merge_states_and_lift_misfiled_orders(tasks: list[Task]) -> None:
    by_id = {t.id: t for t in tasks}
    # three expected states repeat the same three orders: merged to one entry each
    ids = [o["order_id"] for o in by_id["10721002"].extra["required_orders"]]
    assert ids == ["10721002T01", "10721002T02", "10721002T03"]
    assert by_id["10721002"].extra["initial_orders"] == {"10721002T01": {"kind": "order", "status": "paid"}}
    # upstream filed order 30711009O01 as a product of 30711009T03
    lifted = {o["order_id"]: o for o in by_id["30711009"].extra["required_orders"]}
    assert "30711009O01" in lifted and all("order_id" not in p for p in lifted["30711009T03"]["products"])
    kinds = Counter(
        next(k for k in ("order_id", "book_id", "reservation_id") if k in o)
        for t in tasks
        for o in t.extra["required_orders"]
    )
    assert kinds["book_id"] > 0 and kinds["reservation_id"] > 0


def test_path_from_environment_variable_and_domains(monkeypatch: pytest.MonkeyPatch, vitabench_data: Path) -> None:
    monkeypatch.setenv("ENVACE_VITABENCH", str(vitabench_data))
    assert len(load_source("vitabench", domains=["instore"])) == 100
    monkeypatch.delenv("ENVACE_VITABENCH")
    with pytest.raises(ValueError, match="ENVACE_VITABENCH"):
        load_vitabench()
    with pytest.raises(ValueError, match="evaluation set"):
        load_vitabench(split="train", path=str(vitabench_data))


@pytest.fixture
def small_copy(tmp_path: Path, vitabench_data: Path) -> Path:
    shutil.copy(vitabench_data / "tools_delivery.json", tmp_path)
    tasks = json.loads((vitabench_data / "delivery_tasks_en.json").read_text())[:3]
    (tmp_path / "delivery_tasks_en.json").write_text(json.dumps(tasks, indent=1))
    return tmp_path


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_errors_name_file_index_and_field(small_copy: Path) -> None:
    assert len(load_vitabench(path=str(small_copy))) == 3
    tasks_file = small_copy / "delivery_tasks_en.json"
    _edit(tasks_file, lambda d: d[2]["evaluation_criteria"]["expected_states"][0].pop("required_orders"))
    with pytest.raises(
        ValueError,
        match=r"delivery_tasks_en\.json\[2\]\.evaluation_criteria\.expected_states\[0\]"
        r"\.required_orders: missing",
    ):
        load_vitabench(path=str(small_copy))
    _edit(tasks_file, lambda d: d[1].pop("instructions"))
    with pytest.raises(ValueError, match=r"delivery_tasks_en\.json\[1\]\.instructions: missing"):
        load_vitabench(path=str(small_copy))
    tasks_file.write_text('[\n{"id": 1,\n oops}]')
    with pytest.raises(ValueError, match=r"delivery_tasks_en\.json:3:2: not valid JSON"):
        load_vitabench(path=str(small_copy))
    tasks_file.write_bytes(b'[\n{"id": 1,\n "instructions": "caf\xe9"}]')  # latin-1: the byte's line, column and field
    with pytest.raises(ValueError, match=r"delivery_tasks_en\.json:3:22: \[0\]\.instructions: not UTF-8: byte 0xe9"):
        load_vitabench(path=str(small_copy))


def test_tool_file_errors(small_copy: Path) -> None:
    _edit(small_copy / "tools_delivery.json", lambda d: d[4]["function"].pop("name"))
    with pytest.raises(ValueError, match=r"tools_delivery\.json\[4\]\.function\.name: missing"):
        load_vitabench(path=str(small_copy))
    (small_copy / "tools_delivery.json").unlink()
    with pytest.raises(ValueError, match=r"tools_delivery\.json: no such file"):
        load_vitabench(path=str(small_copy))
