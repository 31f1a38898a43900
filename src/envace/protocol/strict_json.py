"""JSON from untrusted text (model output, data files): plain, finite, UTF-8-encodable, or a
:class:`JSONRejected` that says why. Never another exception, whatever the input.

``json.loads`` alone accepts ``NaN``/``Infinity`` and ``1e999`` (which becomes ``inf``), decodes
``"\\ud800"`` into a lone surrogate that no tokenizer or UTF-8 writer accepts, raises a bare
``ValueError`` for an integer past Python's digit limit (4,300), and ``RecursionError`` for deep
nesting. Here each of those is a rejection with a message.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_INT_DIGITS = 4000  # below Python's int-string limit (4300): the limit then never raises
MAX_DEPTH = 512


class JSONRejected(ValueError):
    """The text is not valid JSON (``decode``), or holds a value no consumer can use (``value``).

    Attributes:
        kind: ``decode`` (not JSON at all) or ``value`` (JSON, but non-finite, a lone surrogate, an
            over-long integer, or nested deeper than :data:`MAX_DEPTH`).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _constant(name: str) -> Any:
    raise JSONRejected("value", f"{name} is not a JSON number")


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise JSONRejected("value", f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONRejected("value", f"{text[:40]} is out of the range of a finite number")
    return value


def check_value(value: Any, depth: int = MAX_DEPTH) -> None:
    """Raise :class:`JSONRejected` unless every string of ``value`` encodes as UTF-8, every number is
    finite and nesting stays within ``depth`` (iterative: no recursion limit to hit)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if level > depth:
            raise JSONRejected("value", f"nested deeper than {depth} levels")
        if isinstance(item, str):
            _encodable(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise JSONRejected("value", f"{item} is not a finite number")
        elif isinstance(item, dict):
            for key, child in item.items():
                _encodable(str(key))
                stack.append((child, level + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, level + 1) for child in item)


def _encodable(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise JSONRejected("value", f"a string holds an unpaired surrogate ({exc.reason} at {exc.start})") from None


def loads(text: str) -> Any:
    """``json.loads`` for untrusted text; :class:`JSONRejected` on anything else.

    >>> loads('{"a": [1, 2.5, "x"]}')
    {'a': [1, 2.5, 'x']}
    >>> for bad in ('{"a": NaN}', '[1e999]', '"\\\\ud800"', '[' * 100_000, '9' * 5000, '{oops'):
    ...     try:
    ...         loads(bad)
    ...     except JSONRejected as exc:
    ...         print(exc.kind, str(exc)[:40])
    value NaN is not a JSON number
    value 1e999 is out of the range of a finite nu
    value a string holds an unpaired surrogate (su
    value nested deeper than 512 levels
    value an integer of 5000 digits (at most 4000)
    decode Expecting property name enclosed in doub
    """
    if not isinstance(text, str):
        raise JSONRejected("decode", f"expected text, got {type(text).__name__}")
    _check_depth(text)
    try:
        value = json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float)
    except JSONRejected:
        raise
    except RecursionError:
        raise JSONRejected("value", f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, and any digit limit the hooks did not catch
        raise JSONRejected("decode", str(exc)) from None
    check_value(value)
    return value


def _check_depth(text: str) -> None:
    """Reject nesting deeper than :data:`MAX_DEPTH` before decoding (brackets inside strings counted
    too: an over-estimate only rejects what is already absurdly nested)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    level = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
            if deepest > MAX_DEPTH:
                raise JSONRejected("value", f"nested deeper than {MAX_DEPTH} levels")
        elif ch in "]}":
            level -= 1
