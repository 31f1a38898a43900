"""Python tools as a real environment: a module of plain functions and a TRL-shaped class, used unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.data.sources import load_source
from envace.envs import make_environment
from envace.envs.pytools import PythonToolsEnvironment, first_message, python_env_reward, python_tools
from envace.types import CallRecord, Task, ToolCall, Trajectory

OWN = Path(__file__).resolve().parents[1]
FUNCTIONS = {"kind": "python", "module": "own_tools.notes_tools"}
TRL_CLASS = {"kind": "python", "class": "own_tools.counter_env:CounterEnv"}


@pytest.fixture(autouse=True)
def _own_tools_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(OWN))


def test_plain_functions_become_tools_from_hints_and_docstrings():
    tools = {t["name"]: t for t in python_tools(FUNCTIONS)}
    assert set(tools) == {"word_count", "shout"}  # the private helper is not a tool
    shout = tools["shout"]["parameters"]
    assert shout["required"] == ["text"] and shout["properties"]["times"] == {
        "type": "integer",
        "description": "how many times.",
    }
    env = PythonToolsEnvironment(FUNCTIONS)
    assert env.execute(ToolCall("word_count", {"text": "a b c"})) == {"words": 3}
    assert env.execute(ToolCall("shout", {"text": "hi", "times": 2})) == {"result": "HI HI"}
    assert env.execute(ToolCall("shout", {"text": 3}))["error"]["code"] == "INVALID_ARGUMENTS"
    assert env.execute(ToolCall("_helper", {}))["error"]["code"] == "UNKNOWN_TOOL"
    assert env.execute(ToolCall("__import__", {"name": "os"}))["error"]["code"] == "UNKNOWN_TOOL"


def test_a_trl_shaped_class_is_used_unchanged_and_episodes_are_isolated():
    assert {t["name"] for t in python_tools(TRL_CLASS)} == {"increment", "read"}  # reset, get_reward excepted
    assert first_message(TRL_CLASS, {"target": 5}) == "Increment the counter until it reaches 5."
    task = Task("c", "counter", user_turns=["go"], env=TRL_CLASS, extra={"metadata": {"target": 4}})
    a, b = make_environment(task), make_environment(task)
    assert a.execute(ToolCall("increment", {"by": 3})) == {"result": "The counter is now 3."}
    assert b.execute(ToolCall("read", {})) == {"result": 0}  # a fresh instance per episode
    a.execute(ToolCall("increment", {"by": 1}))
    assert isinstance(a, PythonToolsEnvironment) and a.get_reward() == 1.0 and a.instance.target == 4


def test_python_env_reward_replays_the_calls_into_a_fresh_instance():
    task = Task("c", "counter", user_turns=["go"], env=TRL_CLASS, extra={"metadata": {"target": 2}})
    hit = Trajectory(
        task, [], [CallRecord(ToolCall("increment", {"by": 2}), {"error": {"code": "X", "message": "rehearsed"}})]
    )
    miss = Trajectory(task, [], [CallRecord(ToolCall("increment", {"by": 5}), {"result": "The counter is now 2."})])
    assert python_env_reward(task, hit).score == 1.0  # the state the calls make, not what the responses said
    assert python_env_reward(task, miss).score == 0.0


def test_the_tasks_source_reads_a_trl_class_first_message(tmp_path):
    file = tmp_path / "tasks.jsonl"
    file.write_text('{"user_turns": ["Count to 2."], "gold": [[{"name": "increment", "arguments": {"by": 2}}]], '
                    '"metadata": {"target": 2}}\n'
                    '{"user_turns": ["x"], "gold": [[{"name": "rm", "arguments": {}}]]}\n')  # fmt: skip
    with pytest.raises(ValueError, match=r"tasks.jsonl:2: gold\[0\]: calls 'rm', which no listed tool is"):
        load_source("tasks", path=str(file), env=TRL_CLASS)
    file.write_text(file.read_text().splitlines()[0] + "\n")
    (task,) = load_source("tasks", path=str(file), env=TRL_CLASS, reward="python-env")
    assert task.extra["reward"] == "python-env" and {t["name"] for t in task.tools} == {"increment", "read"}
    file.write_text('{"gold": [[{"name": "increment", "arguments": {"by": 7}}]], "metadata": {"target": 7}}\n')
    (task,) = load_source("tasks", path=str(file), env=TRL_CLASS)
    assert task.user_turns == ["Increment the counter until it reaches 7."]  # what reset(**metadata) returned
    with pytest.raises(ValueError, match="environment class 'own_tools.counter_env:Nope': module"):
        python_tools({"kind": "python", "class": "own_tools.counter_env:Nope"})


def test_python_env_is_registered_by_envs_for_every_reader_of_sources() -> None:
    """``rewards`` names no environment: ``python-env`` is registered by ``envs`` itself, and it is known
    as soon as the sources are (what a config's ``reward:`` option is checked against), in a fresh process."""
    import os
    import subprocess
    import sys

    code = (
        "import envace.rewards as r; alone = 'python-env' in r.REWARDS; import envace.data.sources; "
        "print(alone, r.get_reward('python-env').__module__)"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": src})  # fmt: skip
    assert out.stdout.split() == ["False", "envace.envs.pytools"], out.stderr[-2000:]
