"""A recorded call whose arguments break its tool's own JSON Schema is never gold (a good act): a chat
log keeps it only as an error-answered call, or is refused in one line naming file, line and field;
``envace data prepare`` applies the same rule to every source (docs/data.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.cli import main
from envace.data.prepare import _valid_gold
from envace.data.sources import load_source
from envace.data.sources.chatlog import load_chatlog
from envace.data.sources.records import RecordError
from envace.types import CallRecord, ToolCall

QUOTE = {"type": "function", "function": {"name": "quote", "parameters": {
    "type": "object", "properties": {"symbol": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
                                     "legs": {"type": "array", "items": {"type": "object", "properties": {
                                         "qty": {"type": "integer"}}}}},
    "required": ["symbol"], "additionalProperties": False}}}  # fmt: skip


def _log(tmp_path: Path, args: dict, answer: str | None, retry: dict | None = None) -> Path:
    """One record: a user turn, the call ``quote(**args)`` answered with ``answer`` (``None``: unanswered),
    then optionally a retry ``quote(**retry)`` answered with a price."""
    messages = [
        {"role": "user", "content": "Price of X?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "quote", "arguments": json.dumps(args)}}]},
    ]  # fmt: skip
    if answer is not None:
        messages.append({"role": "tool", "tool_call_id": "c1", "content": answer})
    if retry is not None:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "quote", "arguments": json.dumps(retry)}}]},
            {"role": "tool", "tool_call_id": "c2", "content": '{"price": 1}'},
        ]  # fmt: skip
    messages.append({"role": "assistant", "content": "X is 1."})
    path = tmp_path / "logs.jsonl"
    path.write_text(json.dumps({"id": "r1", "tools": [QUOTE], "messages": messages}) + "\n")
    return path


@pytest.mark.parametrize(
    ("args", "field", "why"),
    [
        ({"symbol": 5}, ".symbol", "5 is not of type 'string'"),  # the case
        ({}, "", "'symbol' is a required property"),
        ({"symbol": "X", "when": "now"}, "", "unknown argument 'when'"),
        ({"symbol": "X", "days": 0}, ".days", "0 is less than the minimum of 1"),
        ({"symbol": "X", "legs": [{"qty": "two"}]}, ".legs[0].qty", "'two' is not of type 'integer'"),
    ],
)
def test_a_call_answered_as_a_success_is_refused_naming_file_line_and_path(tmp_path, args, field, why) -> None:
    path = _log(tmp_path, args, '{"price": 1}')
    with pytest.raises(RecordError) as info:
        load_chatlog(path=str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:1: messages[1].tool_calls[0].function.arguments{field}: {why}"), message
    assert "answered as a success" in message and "\n" not in message


def test_an_unanswered_breaking_call_is_refused(tmp_path) -> None:
    with pytest.raises(RecordError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments\.symbol: .*unanswered"):
        load_chatlog(path=str(_log(tmp_path, {"symbol": 5}, None)))


def test_an_error_answered_call_is_kept_only_as_recorded_not_as_gold(tmp_path) -> None:
    """The log shows the tool refusing the call, then a corrected retry: the act role's gold is the
    retry alone; the refused call stays a recorded call with its error (for the replay and rehearse role)."""
    path = _log(tmp_path, {"symbol": 5}, '{"error": "symbol must be a string"}', retry={"symbol": "X"})
    (task,) = load_chatlog(path=str(path))
    assert task.gold == [[ToolCall("quote", {"symbol": "X"})]]
    assert task.recorded == [
        CallRecord(ToolCall("quote", {"symbol": 5}), {"error": "symbol must be a string"}),
        CallRecord(ToolCall("quote", {"symbol": "X"}), {"price": 1}),
    ]
    assert task.extra["refused_calls"] == 1


def test_an_error_text_that_is_not_an_error_object_does_not_excuse_the_call(tmp_path) -> None:
    with pytest.raises(RecordError, match="answered as a success"):  # plain text is {"result": ...}
        load_chatlog(path=str(_log(tmp_path, {"symbol": 5}, "error: bad symbol")))


def test_data_prepare_refuses_the_chatlog_in_one_line_and_writes_nothing(tmp_path, capsys) -> None:
    path, out = _log(tmp_path, {"symbol": 5}, '{"price": 1}'), tmp_path / "out"
    argv = ["data", "prepare", "--source", "chatlog", "--split", "all", "--path", str(path), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and not out.exists()
    assert f"{path}:1: messages[1].tool_calls[0].function.arguments.symbol: 5 is not of type 'string'" in err
    good = _log(tmp_path, {"symbol": 5}, '{"error": "bad symbol"}', retry={"symbol": "X"})
    assert main([*argv[:-3], str(good), "--out", str(out)]) == 0 and out.is_dir()


def test_every_source_follows_the_rule_in_prepare(capsys) -> None:
    """BFCL's own gold in ``multi_turn_base_173`` closes a ticket by a string id for an ``integer``: the
    source is refused naming the call, or with ``drop_invalid_gold`` the task is left out and named."""
    tasks = load_source("bfcl-multi-turn", split="test", categories=["multi_turn_base"])
    broken = next(t for t in tasks if t.id == "multi_turn_base_173")
    fine = next(t for t in tasks if t.id != broken.id)
    with pytest.raises(ValueError, match=r"task multi_turn_base_173: gold\[3\]\[\d+\]\.arguments\.ticket_id: "
                                         r"'ticket_001' is not of type 'integer'"):  # fmt: skip
        _valid_gold([fine, broken], drop=False)
    kept, left_out = _valid_gold([fine, broken], drop=True)
    assert kept == [fine] and left_out == ["multi_turn_base_173"]
    assert "left out: task multi_turn_base_173" in capsys.readouterr().err
    assert _valid_gold([fine], drop=False) == ([fine], [])
