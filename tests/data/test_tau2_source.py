"""tau2 tasks from the wheel: official splits, canonical fields, and errors that name file and field."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from envace.data.sources import load_source
from envace.data.sources.tau2 import load_tau2, tau2_data_dir
from envace.protocol.parse import tool_name
from envace.types import Task


@pytest.fixture(scope="module")
def all_tasks() -> list[Task]:
    return load_tau2(split="all")


def test_split_sizes_and_disjointness(all_tasks: list[Task]) -> None:
    train, test = load_tau2(split="train"), load_source("tau2", split="test")
    assert Counter(t.category for t in train) == {"airline": 30, "retail": 74, "telecom": 74}
    assert Counter(t.category for t in test) == {"airline": 20, "retail": 40, "telecom": 40}
    assert Counter(t.category for t in all_tasks) == {"airline": 50, "retail": 114, "telecom": 114}
    train_ids, test_ids = {t.id for t in train}, {t.id for t in test}
    assert not train_ids & test_ids
    assert train_ids | test_ids == {t.id for t in all_tasks}
    assert len({t.id for t in all_tasks}) == len(all_tasks)
    assert len(load_tau2(split="small", domains=("telecom",))) == 20


def test_canonical_fields(all_tasks: list[Task]) -> None:
    by_id = {t.id: t for t in all_tasks}
    task = by_id["retail_1"]
    assert task.benchmark == "tau2" and task.env == {"kind": "tau2", "domain": "retail", "task_id": "1"}
    assert "<policy>" in task.system_prompt and "# Retail agent policy" in task.system_prompt
    assert "exchange_delivered_order_items" in {tool_name(t) for t in task.tools}
    # one stand-in opening turn from the scenario, whose gold is every assistant-side action
    assert task.user_turns == [
        "You received your order #W2378156 and wish to exchange the mechanical keyboard for a "
        "similar one but with clicky switches and the smart thermostat for one compatible with "
        "Google Home instead of Apple HomeKit. If there is no keyboard that is clicky, RGB "
        "backlight, full size, you'd rather only exchange the thermostat.\n\n"
        "You are Yusuf Rossi in zip code 19122."
    ]
    assert len(task.gold) == 1
    assert [c.name for c in task.gold[0]][-1] == "exchange_delivered_order_items"
    assert task.gold[0][-1].arguments["new_item_ids"] == ["7747408585"]
    assert task.extra["reward_basis"] == ["DB", "COMMUNICATE"]  # tau2's default, filled in
    assert "Yusuf Rossi" in task.user_sim["text"] and task.user_sim["scenario"]["instructions"]["domain"] == "retail"
    assert "exchange_delivered_order_items" in task.extra["write_tools"]
    assert Task.from_json(task.to_json()) == task


def test_telecom_user_actions_stay_out_of_gold(all_tasks: list[Task]) -> None:
    telecom = [t for t in all_tasks if t.category == "telecom"]
    n_user = sum(a["requestor"] == "user" for t in telecom for a in t.extra["actions"])
    n_gold = sum(len(t.gold[0]) for t in telecom)
    n_assistant = sum(a["requestor"] == "assistant" for t in telecom for a in t.extra["actions"])
    assert n_user > 0 and n_gold == n_assistant
    assert all(c.name not in t.extra["user_tools"] for t in telecom for c in t.gold[0])
    assert all(t.extra["initial_state"]["initialization_actions"] for t in telecom)
    assert Counter(tuple(t.extra["reward_basis"]) for t in telecom) == {
        ("ENV_ASSERTION",): 94,
        ("ENV_ASSERTION", "ACTION"): 20,
    }


@pytest.fixture
def copy_of_airline(tmp_path: Path) -> Path:
    shutil.copytree(tau2_data_dir() / "airline", tmp_path / "airline")
    return tmp_path


def _rewrite(folder: Path, edit) -> None:
    path = folder / "airline" / "tasks.json"
    tasks = json.loads(path.read_text())
    edit(tasks)
    path.write_text(json.dumps(tasks, indent=1))


def test_errors_name_file_index_and_field(copy_of_airline: Path) -> None:
    def drop_name(tasks: list) -> None:
        del tasks[3]["evaluation_criteria"]["actions"][1]["name"]

    _rewrite(copy_of_airline, drop_name)
    with pytest.raises(ValueError, match=r"tasks\.json\[3\]\.evaluation_criteria\.actions\[1\]\.name: Field required"):
        load_tau2(path=str(copy_of_airline), domains=("airline",))


def test_errors_on_broken_json_and_unknown_split(copy_of_airline: Path) -> None:
    (copy_of_airline / "airline" / "tasks.json").write_text('[\n  {"id": "0",,}\n]')
    with pytest.raises(ValueError, match=r"tasks\.json:2:\d+: not valid JSON"):
        load_tau2(path=str(copy_of_airline), domains=("airline",))
    (copy_of_airline / "airline" / "tasks.json").write_text('[{"id": "0", "ticket": NaN}]')
    with pytest.raises(ValueError, match=r"tasks\.json: \[0\]\.ticket: unusable JSON value: NaN is not a JSON number"):
        load_tau2(path=str(copy_of_airline), domains=("airline",))
    with pytest.raises(ValueError, match=r"split_tasks\.json: no split 'dev'"):
        load_tau2(split="dev", domains=("airline",))
    with pytest.raises(ValueError, match="unknown tau2 domain"):
        load_tau2(domains=("banking",))


def test_path_layout_loads_the_same_tasks(copy_of_airline: Path, all_tasks: list[Task]) -> None:
    copied = load_tau2(path=str(copy_of_airline), domains=("airline",))
    assert copied == [t for t in all_tasks if t.category == "airline"]
