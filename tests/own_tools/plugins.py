"""A user's own source and reward, named ``own_tools.plugins:<name>`` in a config."""

from __future__ import annotations

import os
from pathlib import Path

from envace.types import Task, ToolCall, Trajectory

ENV = {"kind": "python", "module": "own_tools.notes_tools"}


def notes_source(split: str = "all", path: str | None = None, **options) -> list[Task]:
    """Four tasks over the plain-function tools, with gold calls and the user reward below."""
    from envace.envs.pytools import python_tools

    tools = python_tools(ENV)
    texts = ["the cat sat", "a b c d", "hello", "one two"]
    return [
        Task(
            id=f"notes-{i}",
            benchmark="notes",
            tools=tools,
            user_turns=[f"How many words are in '{t}'?"],
            gold=[[ToolCall("word_count", {"text": t})]],
            env=ENV,
            extra={"reward": "own_tools.plugins:called_word_count"},
        )
        for i, t in enumerate(texts)
    ]


def called_word_count(task: Task, trajectory: Trajectory) -> float | None:
    """1 when the episode called word_count; None ("cannot compute") for the task notes-3; every call
    noted in $ENVACE_TEST_REWARD_LOG (the test reads it: the fit used this reward)."""
    log = os.environ.get("ENVACE_TEST_REWARD_LOG")
    if log:
        with Path(log).open("a") as fh:
            fh.write(task.id + "\n")
    if task.id == "notes-3":
        return None
    return float(any(r.call.name == "word_count" for r in trajectory.calls))


def broken(task: Task, trajectory: Trajectory):
    return "not a number"


NOT_CALLABLE = 3


def one_argument(task: Task) -> float:  # a reward must take (task, trajectory)
    return 1.0


def not_a_list(split: str = "all", path: str | None = None, **options) -> str:
    return "rows"
