"""Untrusted data files: every failure is one :class:`RecordError` naming file, line and field.

JSON-lines files are read as bytes, split on ``\\n`` only and decoded line by line, so a bad byte
names its line (a text-mode reader raises one ``UnicodeDecodeError`` for the file, with no line).
Every JSON text goes through :func:`envace.protocol.strict_json.loads`: ``NaN``, ``1e999``, lone
surrogates, 5,000-digit integers and 100,000-deep nesting are rejections like a syntax error, never
a traceback or a value that breaks a later writer. Whole-file readers (:func:`read_json`) name the
file and, where ``json`` gives one, the line and column.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from envace.protocol import strict_json
from envace.protocol.strict_json import JSONRejected

_JSON_POSITION = re.compile(r"^(?P<msg>.*): line (?P<line>\d+) column (?P<col>\d+) \(char \d+\)$", re.DOTALL)


class RecordError(ValueError):
    """A malformed data file or record: ``<file>:<line>[:<column>]: [<field>: ]<problem>``.

    ``line`` is 1-based, and ``None`` only for a problem of the whole file (unreadable, no records,
    a whole-file JSON value with no position). A ``ValueError``, so ``envace data`` prints it as one
    line and exits 2.
    """

    def __init__(
        self, file: Path | str, line: int | None, field: str | None, message: str, column: int | None = None
    ) -> None:
        self.file, self.line, self.field, self.column, self.problem = str(file), line, field, column, message
        where = str(file) if line is None else f"{file}:{line}" + ("" if column is None else f":{column}")
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across worker processes, like a plain ValueError
        return (type(self), (self.file, self.line, self.field, self.problem, self.column))


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: a value echoed in an error keeps it one short line.

    >>> short("x" * 100, limit=10)
    "'xxxxxx..."
    """
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def split_position(message: str) -> tuple[str, int | None, int | None]:
    """A ``json`` error message as ``(message, line, column)``, its ``: line L column C (char N)`` cut off.

    >>> split_position("Expecting value: line 1 column 5 (char 4)")
    ('Expecting value', 1, 5)
    """
    found = _JSON_POSITION.match(message)
    if found is None:
        return message, None, None
    return found["msg"], int(found["line"]), int(found["col"])


class _Rejected(str):
    """A number ``strict_json`` rejects, kept as a marker so :func:`value_field` can find it."""


def _bad_number(text: str) -> Any:
    value = float(text)
    return _Rejected(text) if not math.isfinite(value) else value


def _big_int(text: str) -> Any:
    return _Rejected(text) if len(text.lstrip("-")) > strict_json.MAX_INT_DIGITS else int(text)


def _key(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{short(key, 30)}]"


def _nodes(value: Any) -> list[tuple[Any, str, int]]:
    """``(value or key, field path, nesting level)`` of every node, in document order."""
    out: list[tuple[Any, str, int]] = []
    stack = [(value, "", 0)]
    while stack:
        item, path, level = stack.pop()
        out.append((item, path, level))
        if isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append((child, path + _key(key), level + 1))
                stack.append((key, path + _key(key), level + 1))  # popped first: the key, then its value
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]", level + 1) for i, child in reversed(list(enumerate(item))))
    return out


def _surrogate(item: Any) -> bool:
    if not isinstance(item, str) or isinstance(item, _Rejected):
        return False
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def value_field(text: str) -> str | None:
    """The field path (``messages[1].content``) of the value ``strict_json`` rejected in ``text``.

    Why: a lone surrogate or a 5,000-digit integer is a problem of one field, and the message should
    say which. Numbers are looked for first, in document order (``json`` rejects them while parsing),
    then strings. ``None`` when the line itself is at fault (too deep) or the whole value is the culprit.
    """
    try:
        value = json.loads(text, parse_int=_big_int, parse_float=_bad_number, parse_constant=_Rejected)
    except (ValueError, RecursionError):
        return None
    nodes = _nodes(value)
    if any(level >= strict_json.MAX_DEPTH for item, _, level in nodes if isinstance(item, dict | list)):
        return None
    for culprit in (lambda item: isinstance(item, _Rejected), _surrogate):
        for item, path, _ in nodes:
            if culprit(item):
                return path.removeprefix(".") or None
    return None


def loads(text: str, file: Path | str, line: int | None) -> Any:
    """``strict_json.loads(text)``, a rejection raised as a :class:`RecordError` at ``file:line``.

    ``line`` is the line ``text`` was read from (JSON lines), or ``None`` for a whole file, whose
    line then comes from ``json``'s own position.
    """
    try:
        return strict_json.loads(text)
    except JSONRejected as exc:
        if exc.kind == "decode":
            message, at_line, column = split_position(str(exc))
            where = line if line is not None else at_line
            raise RecordError(file, where, None, f"not valid JSON: {message}", column=column) from None
        raise RecordError(file, line, value_field(text), f"unusable JSON value: {exc}") from None


def _decode(data: bytes, file: Path | str, line: int | None) -> str:
    """``data`` as UTF-8; a bad byte is an error at its line and (character) column, and at the JSON
    field whose string holds it (decoded with ``surrogateescape``, the byte is a lone surrogate that
    :func:`value_field` finds)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        at_line = line if line is not None else data.count(b"\n", 0, exc.start) + 1
        column = len(data[start : exc.start].decode("utf-8")) + 1
        message = f"not UTF-8: byte 0x{data[exc.start]:02x} ({exc.reason})"
        field = value_field(data.decode("utf-8", "surrogateescape"))
        raise RecordError(file, at_line, field, message, column=column) from None


def _read_bytes(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except FileNotFoundError:
        raise RecordError(file, None, None, "no such file") from None
    except OSError as exc:
        raise RecordError(file, None, None, f"cannot read: {exc.strerror or exc}") from None


def read_jsonl(file: Path) -> list[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of a JSON-lines file, decoded per line.

    A file without a single record is an error: an empty input never means an empty dataset.
    """
    rows = []
    data = _read_bytes(file)
    for n, raw in enumerate(data.split(b"\n"), start=1):
        text = _decode(raw, file, n)
        if n == 1:
            text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark, as some editors write
        if text.strip():
            rows.append((n, loads(text, file, n)))
    if not rows:
        why = "the file is empty" if not data else "only blank lines"
        raise RecordError(file, None, None, f"no records ({why})")
    return rows


def read_json(file: Path) -> Any:
    """A whole JSON file (tau2, VitaBench); errors name the file and, where json gives one, line:column."""
    text = _decode(_read_bytes(file), file, None).removeprefix("\ufeff")
    return loads(text, file, None)
