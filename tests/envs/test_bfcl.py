"""BFCLEnvironment: validated, whitelisted dispatch onto bfcl-eval's API classes; errors never raise."""

from __future__ import annotations

import json

import pytest

from envace.data.sources.bfcl import load_multi_turn
from envace.envs import make_environment
from envace.envs.bfcl import BFCLEnvironment, to_json
from envace.types import ToolCall, is_error


@pytest.fixture(scope="module")
def tasks():
    return {t.id: t for t in load_multi_turn()}


def code(response):
    assert is_error(response), response
    return response["error"]["code"]


def test_a_valid_call_changes_state_and_returns_json(tasks):
    env = make_environment(tasks["multi_turn_base_0"])
    assert isinstance(env, BFCLEnvironment)
    before = env.snapshot()
    response = env.execute(ToolCall("mkdir", {"dir_name": "new_dir"}))
    assert not is_error(response)
    after = env.snapshot()
    assert after != before
    root = after["GorillaFileSystem"]["root"]
    assert root["name"] == "workspace" and "new_dir" in root["contents"]
    assert json.loads(json.dumps(after)) == after  # the snapshot is plain JSON
    assert env.execute(ToolCall("ls", {}))["current_directory_content"] == ["document", "archive", "new_dir"]


def test_unknown_tool_bad_arguments_and_crashes_are_structured(tasks):
    env = BFCLEnvironment.from_task(tasks["multi_turn_base_0"])
    before = env.snapshot()
    assert code(env.execute(ToolCall("rm_rf", {}))) == "UNKNOWN_TOOL"
    assert code(env.execute(ToolCall("mkdir", {}))) == "INVALID_ARGUMENTS"  # required dir_name missing
    assert code(env.execute(ToolCall("mkdir", {"dir_name": 3}))) == "INVALID_ARGUMENTS"
    assert (
        code(env.execute(ToolCall("mkdir", {"dir_name": "x", "mode": 7}))) == "INVALID_ARGUMENTS"
    )  # not in the schema
    assert code(env.execute(ToolCall("__init__", {}))) == "UNKNOWN_TOOL"
    assert env.snapshot() == before
    # the API's own error answers pass through as its response
    assert is_error(env.execute(ToolCall("cd", {"folder": "no_such_folder"})))


def test_only_public_methods_named_in_the_docs_are_dispatched(tasks):
    task = tasks["multi_turn_base_0"]
    sneaky = [{"name": "_load_scenario", "parameters": {"type": "dict", "properties": {}}}]
    env = BFCLEnvironment(task.env["initial_config"], task.env["involved_classes"], task.tools + sneaky)
    assert code(env.execute(ToolCall("_load_scenario", {}))) == "UNKNOWN_TOOL"


def test_missed_function_becomes_callable_at_its_turn(tasks):
    env = BFCLEnvironment.from_task(tasks["multi_turn_miss_func_0"])
    sort = ToolCall("sort", {"file_name": "final_report.pdf"})
    assert "sort" not in {t["name"] for t in env.tools()}
    assert code(env.execute(sort)) == "UNKNOWN_TOOL"
    env.set_turn(3)
    assert "sort" in {t["name"] for t in env.tools()}
    env.execute(ToolCall("cd", {"folder": "document"}))
    assert not is_error(env.execute(sort))


def test_long_context_scenarios_load_the_long_variant(tasks):
    base = BFCLEnvironment.from_task(tasks["multi_turn_base_0"]).snapshot()
    long = BFCLEnvironment.from_task(tasks["multi_turn_long_context_0"]).snapshot()
    assert len(json.dumps(long)) > len(json.dumps(base))


def test_to_json_handles_cycles_sets_and_objects():
    class Node:
        def __init__(self, name, parent=None):
            self.name, self.parent, self._secret, self.children = name, parent, object(), []

    root = Node("/")
    root.children.append(Node("a", root))
    assert to_json(root) == {
        "__class__": "Node",
        "name": "/",
        "parent": None,
        "children": [{"__class__": "Node", "name": "a", "parent": "<Node (cycle)>", "children": []}],
    }
    assert to_json({"s": {3, 1}, "t": (1, "x"), "f": float("inf")}) == {"s": [1, 3], "t": [1, "x"], "f": "inf"}
