"""OpenAI-chat logs with recorded tool results: turns, gold, recorded pairs, and precise errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.data.sources import load_source
from envace.data.sources.chatlog import load_chatlog
from envace.types import CallRecord, Task, ToolCall

TOOLS = [
    {"type": "function", "function": {"name": "quote", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "news", "parameters": {"type": "object", "properties": {}}}},
]


def _call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def record(**over) -> dict:
    rec = {
        "id": "r1",
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You are a finance assistant."},
            {"role": "user", "content": "Price of X and Y?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("c1", "quote", {"symbol": "X"}), _call("c2", "quote", {"symbol": "Y"})],
            },
            {"role": "tool", "tool_call_id": "c2", "content": '{"price": 2}'},
            {"role": "tool", "tool_call_id": "c1", "content": '{"price": 1}'},
            {"role": "assistant", "content": "X is 1, Y is 2."},
            {"role": "user", "content": [{"type": "text", "text": "Any news?"}]},
            {"role": "assistant", "content": "", "tool_calls": [_call("c3", "news", {})]},
            {"role": "tool", "tool_call_id": "c3", "content": "Nothing new."},
            {"role": "assistant", "content": "Nothing new today."},
        ],
    }
    rec.update(over)
    return rec


def write(tmp_path: Path, *lines: str | dict, name: str = "logs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_record_to_task(tmp_path: Path) -> None:
    (task,) = load_chatlog(path=str(write(tmp_path, record())))
    assert task.id == "r1" and task.benchmark == "chatlog" and task.env is None
    assert task.system_prompt == "You are a finance assistant."
    assert task.user_turns == ["Price of X and Y?", "Any news?"]
    assert task.gold == [
        [ToolCall("quote", {"symbol": "X"}), ToolCall("quote", {"symbol": "Y"})],
        [ToolCall("news", {})],
    ]
    assert task.recorded == [  # call order, matched by id, outputs parsed (plain text wrapped)
        CallRecord(ToolCall("quote", {"symbol": "X"}), {"price": 1}),
        CallRecord(ToolCall("quote", {"symbol": "Y"}), {"price": 2}),
        CallRecord(ToolCall("news", {}), {"result": "Nothing new."}),
    ]
    assert task.tools == TOOLS and task.extra["final_response"] == "Nothing new today."
    assert Task.from_json(task.to_json()) == task


def test_folder_split_default_ids_and_benchmark(tmp_path: Path) -> None:
    write(tmp_path, record(split="train"), "", record(id=None, split="test"), name="a.jsonl")
    write(tmp_path, record(id="b1"), name="b.jsonl")
    tasks = load_source("chatlog", path=str(tmp_path))
    assert [t.id for t in tasks] == ["r1", "a-3", "b1"]
    assert [t.id for t in load_chatlog(split="test", path=str(tmp_path))] == ["a-3"]
    assert {t.benchmark for t in load_chatlog(path=str(tmp_path), benchmark="finmcp")} == {"finmcp"}


def _broken_call(**fn) -> dict:
    rec = record()
    rec["messages"][2]["tool_calls"][0]["function"] = fn
    return rec


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"id": "x"}, r"logs\.jsonl:3: messages: missing"),
        (_broken_call(arguments="{}"), r"logs\.jsonl:3: messages\[2\]\.tool_calls\[0\]\.function\.name: missing"),
        (
            _broken_call(name="quote", arguments="{symbol: X"),
            r"logs\.jsonl:3: messages\[2\]\.tool_calls\[0\]\.function\.arguments: not valid JSON",
        ),
        (
            _broken_call(name="quote", arguments="[1]"),
            r"logs\.jsonl:3: messages\[2\]\.tool_calls\[0\]\.function\.arguments: expected a JSON object",
        ),
        (
            record(
                messages=[{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "zz", "content": "1"}]
            ),
            r"logs\.jsonl:3: messages\[1\]\.tool_call_id: no earlier unanswered call with id 'zz'",
        ),
        (record(messages=[{"role": "robot", "content": "hi"}]), r"logs\.jsonl:3: messages\[0\]\.role: expected"),
        (
            record(tools=[{"type": "function", "function": {"parameters": {}}}]),
            r"logs\.jsonl:3: tools\[0\]\.function\.name: missing",
        ),
        (record(messages=[{"role": "system", "content": "s"}]), r"logs\.jsonl:3: messages: no user message"),
    ],
)
def test_malformed_records_name_file_line_and_field(tmp_path: Path, bad: dict, message: str) -> None:
    path = write(tmp_path, record(), record(id="r2"), bad)
    with pytest.raises(ValueError, match=message):
        load_chatlog(path=str(path))


def test_broken_json_line_and_missing_path(tmp_path: Path) -> None:
    path = write(tmp_path, record(), '{"messages": [', record())
    with pytest.raises(ValueError, match=r"logs\.jsonl:2: not valid JSON"):
        load_chatlog(path=str(path))
    with pytest.raises(ValueError, match="pass path="):
        load_chatlog()
    with pytest.raises(ValueError, match="no such file"):
        load_chatlog(path=str(tmp_path / "missing.jsonl"))


def test_unanswered_calls_are_gold_but_not_recorded(tmp_path: Path) -> None:
    rec = record()
    del rec["messages"][8]  # the news call got no tool message
    (task,) = load_chatlog(path=str(write(tmp_path, rec)))
    assert task.gold[1] == [ToolCall("news", {})]
    assert [r.call.name for r in task.recorded] == ["quote", "quote"] and task.extra["unanswered_calls"] == 1
