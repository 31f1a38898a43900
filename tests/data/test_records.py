"""Untrusted data files: per-line decoding, strict JSON, and one error type naming file, line and field."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from envace.data.sources.records import RecordError, read_json, read_jsonl, value_field


def test_the_message_is_file_line_column_field_problem() -> None:
    assert str(RecordError("a.jsonl", 3, "messages[0].role", "missing")) == "a.jsonl:3: messages[0].role: missing"
    assert str(RecordError("a.jsonl", 3, None, "not valid JSON: x", column=7)) == "a.jsonl:3:7: not valid JSON: x"
    assert str(RecordError("a.jsonl", None, None, "no records")) == "a.jsonl: no records"
    assert issubclass(RecordError, ValueError)  # what `envace data` prints as one line, exit 2
    err = pickle.loads(pickle.dumps(RecordError("a.jsonl", 3, "id", "missing", column=2)))
    assert (str(err), err.line, err.field, err.column) == ("a.jsonl:3:2: id: missing", 3, "id", 2)


def test_jsonl_lines_are_decoded_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\n  \n[2]')  # BOM, CRLF, blank lines, no final newline
    assert read_jsonl(path) == [(1, {"a": 1}), (4, [2])]
    path.write_bytes(b'{"a": 1}\n{"b": "caf\xe9", "c": 2}\n')  # latin-1, not UTF-8: only line 2 is at fault
    with pytest.raises(RecordError) as info:
        read_jsonl(path)
    # column 11 counts characters: `{"b": "caf` is 10 of them
    assert str(info.value) == f"{path}:2:11: b: not UTF-8: byte 0xe9 (invalid continuation byte)"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"a": [1, {"b": NaN}]}', "a[1].b"),
        ('{"a": 1, "b": 1e999}', "b"),
        ('{"messages": [{"content": "\\ud800"}]}', "messages[0].content"),
        ('{"x y": {"\\udc00": 1}}', "['x y']['\\udc00']"),  # keys that are not names, escaped
        ('{"s": "\\ud800", "n": ' + "9" * 5000 + "}", "n"),  # numbers first: json rejects them first
        ("[" * 600 + "]" * 600, None),  # too deep: the line itself
        ('"\\ud800"', None),  # the whole value
    ],
)
def test_value_field_names_the_rejected_value(text: str, field: str | None) -> None:
    assert value_field(text) == field


def test_whole_file_errors_name_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    path.write_bytes(b'[\n  {"id": 1},\n  {"id": "\xff"}\n]')
    with pytest.raises(RecordError, match=r"tasks\.json:3:11: \[1\]\.id: not UTF-8: byte 0xff"):
        read_json(path)
    path.write_text('[\n  {"id": 1},,\n]')
    with pytest.raises(RecordError, match=r"tasks\.json:2:13: not valid JSON: Expecting value"):
        read_json(path)
    path.write_text('[{"id": 1}, {"id": ' + "9" * 5000 + "}]")  # json gives no position: the field instead
    with pytest.raises(RecordError, match=r"tasks\.json: \[1\]\.id: unusable JSON value: an integer of 5000 digits"):
        read_json(path)
    with pytest.raises(RecordError, match=r"nope\.json: no such file"):
        read_json(tmp_path / "nope.json")
