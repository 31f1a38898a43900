"""OpenAI-chat logs with recorded tool results: turns, gold, recorded pairs, and precise errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.data.sources import load_source
from envace.data.sources.chatlog import load_chatlog
from envace.data.sources.records import RecordError
from envace.types import CallRecord, Task, ToolCall

TOOLS = [
    {
        "type": "function",
        "function": {"name": "quote", "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}}},
    },
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
    with pytest.raises(RecordError, match=r"logs\.jsonl:2:15: not valid JSON: Expecting value"):
        load_chatlog(path=str(path))
    with pytest.raises(ValueError, match="pass path="):
        load_chatlog()
    with pytest.raises(RecordError, match="missing.jsonl: no such file"):
        load_chatlog(path=str(tmp_path / "missing.jsonl"))


def test_unanswered_calls_are_gold_but_not_recorded(tmp_path: Path) -> None:
    rec = record()
    del rec["messages"][8]  # the news call got no tool message
    (task,) = load_chatlog(path=str(write(tmp_path, rec)))
    assert task.gold[1] == [ToolCall("news", {})]
    assert [r.call.name for r in task.recorded] == ["quote", "quote"] and task.extra["unanswered_calls"] == 1


# ------------------------------------------------------------------ untrusted files


def _named(name: str) -> dict:
    rec = record()
    rec["messages"][2]["tool_calls"][1]["function"]["name"] = name
    return rec


PROBES = {  # line 2 of a file whose line 1 is a good record -> what the error says after "<file>:"
    "unknown tool": (
        json.dumps(_named("qoute")).encode(),
        "2: messages[2].tool_calls[1].function.name: 'qoute' "
        "is not a listed tool; the record's tools are 'quote', 'news'",
    ),
    "non-UTF-8 byte": (
        b'{"id": "caf\xe9", "messages": []}',
        "2:12: id: not UTF-8: byte 0xe9 (invalid continuation byte)",
    ),
    "5,000-digit integer": (
        json.dumps(record(id=0)).replace('"id": 0', '"id": ' + "9" * 5000).encode(),
        "2: id: unusable JSON value: an integer of 5000 digits (at most 4000)",
    ),
    "lone surrogate": (
        json.dumps(record()).replace('"Price of X and Y?"', '"\\ud800"').encode(),
        "2: messages[1].content: unusable JSON value: a string holds an unpaired surrogate "
        "(surrogates not allowed at 0)",
    ),
    "100,000 deep": (
        b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "2: unusable JSON value: nested deeper than 512 levels",
    ),
}


@pytest.mark.parametrize("probe", list(PROBES))
def test_each_probe_is_one_line_naming_file_line_and_field(tmp_path: Path, probe: str) -> None:
    line, says = PROBES[probe]
    path = tmp_path / "logs.jsonl"
    path.write_bytes(json.dumps(record()).encode() + b"\n" + line + b"\n")
    with pytest.raises(RecordError) as info:
        load_chatlog(path=str(path))
    assert str(info.value) == f"{path}:{says}"
    assert info.value.line == 2


def test_an_empty_input_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "logs.jsonl"
    path.write_bytes(b"")
    with pytest.raises(RecordError) as info:
        load_chatlog(path=str(path))
    assert str(info.value) == f"{path}: no records (the file is empty)" and info.value.line is None  # no line to name
    path.write_text("\n  \n")
    with pytest.raises(RecordError, match=r"logs\.jsonl: no records \(only blank lines\)$"):
        load_chatlog(path=str(path))
    with pytest.raises(RecordError, match=r"logs\.jsonl: no record has split 'train'"):  # the filter kept nothing
        load_chatlog(split="train", path=str(write(tmp_path, record(split="test"))))
    (tmp_path / "none").mkdir()
    with pytest.raises(RecordError, match=r"none: no \*\.jsonl files in this folder"):
        load_chatlog(path=str(tmp_path / "none"))


def test_calls_must_name_a_listed_tool_and_parts_must_be_text(tmp_path: Path) -> None:
    unlisted = r"logs\.jsonl:1: messages\[2\]\.tool_calls\[0\]\.function\.name: 'quote' is not a listed tool"
    with pytest.raises(RecordError, match=unlisted + "; the record lists no tools"):
        load_chatlog(path=str(write(tmp_path, record(tools=None))))
    image = record()
    image["messages"][1]["content"] = [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {}}]
    with pytest.raises(RecordError, match=r"messages\[1\]\.content\[1\]\.type: only text parts are supported"):
        load_chatlog(path=str(write(tmp_path, image)))  # an image would be lost in a text task
    bad_split = record(split=["train"])
    with pytest.raises(RecordError, match=r"logs\.jsonl:2: split: expected str, got list"):  # checked, not skipped
        load_chatlog(split="test", path=str(write(tmp_path, record(split="test"), bad_split)))


def test_tool_outputs_and_arguments_are_strict_json(tmp_path: Path) -> None:
    rec = record()
    rec["messages"][3]["content"] = '{"price": NaN}'  # not usable JSON: kept as the text it is
    (task,) = load_chatlog(path=str(write(tmp_path, rec)))
    assert task.recorded[1].response == {"result": '{"price": NaN}'}
    too_long = r"logs\.jsonl:1: messages\[2\]\.tool_calls\[0\]\.function\.arguments: unusable JSON value: an integer"
    with pytest.raises(RecordError, match=too_long + " of 5000 digits"):
        load_chatlog(path=str(write(tmp_path, _broken_call(name="quote", arguments="[" + "9" * 5000 + "]"))))


# ------------------------------------------------------------------ fuzz: records, or one RecordError

KEYS = [
    "id",
    "split",
    "tools",
    "messages",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "function",
    "name",
    "arguments",
    "type",
    "text",
]
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6) | st.sampled_from(KEYS)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
PATHS = [
    ("id",),
    ("tools",),
    ("tools", 0),
    ("tools", 1, "function", "name"),
    ("messages",),
    ("messages", 1),
    ("messages", 1, "content"),
    ("messages", 1, "role"),
    ("messages", 2, "tool_calls"),
    ("messages", 2, "tool_calls", 0, "id"),
    ("messages", 2, "tool_calls", 1, "function"),
    ("messages", 2, "tool_calls", 1, "function", "name"),
    ("messages", 2, "tool_calls", 1, "function", "arguments"),
    ("messages", 3, "tool_call_id"),
    ("messages", 8, "content"),
    ("messages", 6, "content", 0),
]
ADVERSARIAL = [
    '{"id": NaN}',
    "[1e999]",
    '"\\ud800"',
    "[" * 100_000,
    "9" * 5000,
    "{" * 600,
    "\ufeff{}",
    "[]",
    "null",
    '{"messages": ' + "[" * 511 + "]" * 511 + "}",
    '{"messages": [{"role": "user", "content": "\\udfff"}]}',
]


def _mutated(path: tuple, value: object, delete: bool) -> str:
    """A good record with the field at ``path`` replaced by ``value`` (or deleted)."""
    rec = copy.deepcopy(record())  # TOOLS is shared
    *parents, last = path
    node = rec
    for key in parents:
        node = node[key]
    if delete:
        del node[last]
    else:
        node[last] = value
    return json.dumps(rec)


def _truncated(cut: int) -> bytes:
    line = json.dumps(record()).encode()
    return line[: cut % len(line)]


LINES = st.one_of(
    st.builds(_mutated, st.sampled_from(PATHS), JSON_VALUES, st.booleans()).map(str.encode),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.integers(0, 10_000).map(_truncated),
    st.binary(max_size=30),
    st.sampled_from(ADVERSARIAL).map(str.encode),
    st.just(json.dumps(record()).encode()),
    st.just(b"   "),
)


def _blank(data: bytes) -> bool:
    """True when a reader finds no record: every line decodes to whitespace (a BOM allowed on line 1)."""
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return False
    return not "".join([lines[0].removeprefix("\ufeff"), *lines[1:]]).strip()


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(LINES, max_size=4), ending=st.sampled_from([b"\n", b"\r\n"]), split=st.sampled_from(["all", "test"])
)
def test_fuzz_reader_returns_tasks_or_one_record_error(
    tmp_path: Path, lines: list[bytes], ending: bytes, split: str
) -> None:
    path = tmp_path / "fuzz.jsonl"
    data = ending.join(lines)
    path.write_bytes(data)
    try:
        tasks = load_chatlog(split=split, path=str(path))
    except RecordError as exc:  # anything else fails the test
        message = str(exc)
        assert "\n" not in message
        if exc.line is None:  # only a file without records, or a split filter that kept none
            whole_file = (
                "no records (the file is empty)",
                "no records (only blank lines)",
                "no record has split 'test'",
            )
            assert message in [f"{path}: {why}" for why in whole_file]
            assert _blank(data) == message.startswith(f"{path}: no records")
        else:
            assert 1 <= exc.line <= data.count(b"\n") + 1 and message.startswith(f"{path}:{exc.line}:")
    else:
        assert tasks and all(Task.from_json(t.to_json()) == t for t in tasks)
