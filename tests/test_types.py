"""``Task.first_turns``: the one cut of a task to its first user turns, every per-turn field with them
(the DataModule, the evaluation filter, ``envace show``, the agreement study and the bench all use it)."""

from __future__ import annotations

from envace.types import CallRecord, Task, ToolCall

F, G, H = ToolCall("f", {"x": 1}), ToolCall("g"), ToolCall("h")
TOOL = {"name": "t", "parameters": {}}


def three_turns(**extra: object) -> Task:
    return Task(
        "t",
        "bfcl",
        user_turns=["a", "b", "c"],
        gold=[[F], [G], [H]],
        tools_added={"0": [TOOL], "1": [TOOL], "2": [TOOL]},
        recorded=[CallRecord(F, 1), CallRecord(G, 2), CallRecord(H, 3)],
        extra=dict(extra),
    )


def test_every_per_turn_field_is_cut() -> None:
    task = three_turns(ground_truth=[["f(x=1)"], ["g()"], ["h()"]], final_response="bye", path=["p"])
    cut = task.first_turns(2)
    assert cut.user_turns == ["a", "b"] and cut.gold == [[F], [G]]
    assert sorted(cut.tools_added) == ["0", "1"]  # the tools of turn 2 never appear
    assert cut.extra["ground_truth"] == [["f(x=1)"], ["g()"]]
    assert [r.response for r in cut.recorded] == [1, 2]  # the responses of the kept turns' calls
    assert "final_response" not in cut.extra  # it answered turn 2
    assert cut.extra["truncated_from"] == 3 and cut.extra["path"] == ["p"]  # other fields as they were
    assert len(task.user_turns) == len(task.extra["ground_truth"]) == 3 and "final_response" in task.extra


def test_without_ground_truth_and_with_one_that_is_not_per_turn() -> None:
    cut = three_turns().first_turns(1)  # tau2, chat logs: no ground_truth at all
    assert cut.user_turns == ["a"] and cut.gold == [[F]] and "ground_truth" not in cut.extra
    answers = ["Paris", "paris", "PARIS", "Paris, France"]  # possible answers of one item (BFCL memory)
    assert three_turns(ground_truth=answers).first_turns(1).extra["ground_truth"] == answers


def test_nothing_to_cut_returns_the_task_itself() -> None:
    task = three_turns()
    assert task.first_turns(None) is task and task.first_turns(3) is task and task.first_turns(7) is task
    empty = Task("sim", "tau2")  # a simulator writes the user turns: no turns to cut
    assert empty.first_turns(1) is empty
    assert Task("s", "bfcl", user_turns=["a", "b"]).first_turns(1).gold == []  # no gold known
