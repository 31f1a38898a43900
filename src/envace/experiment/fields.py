"""Strict reading of the experiment's JSON files: a wrong field raises ``ValueError`` naming the file
and the dotted field (``units/*.json``, ``experiment.json``, ``pauses.json``). Integers count where a
float is expected; booleans never count as numbers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Fields:
    """Typed access to the fields of one JSON object; errors name the file and the dotted field."""

    def __init__(self, obj: Any, file: Path, prefix: str = "") -> None:
        if not isinstance(obj, dict):
            raise ValueError(f"{file}: {prefix.rstrip('.') or 'top level'} must be a JSON object")
        self.obj, self.file, self.prefix = obj, file, prefix

    def error(self, key: str, what: str) -> ValueError:
        return ValueError(f"{self.file}: field '{self.prefix}{key}' {what}")

    def get(self, key: str, check: Callable[[Any], bool], what: str, optional: bool = False) -> Any:
        if key not in self.obj:
            raise self.error(key, "is missing")
        value = self.obj[key]
        if (value is None and optional) or check(value):
            return value
        raise self.error(key, f"must be {what}{' or null' if optional else ''}, got {type(value).__name__}")

    def text(self, key: str) -> str:
        return str(self.get(key, lambda v: isinstance(v, str), "a string"))

    def integer(self, key: str, optional: bool = False) -> Any:
        return self.get(key, is_int, "an integer", optional)

    def number(self, key: str, optional: bool = False) -> float | None:
        value = self.get(key, is_number, "a number", optional)
        return None if value is None else float(value)

    def maybe_number(self, key: str) -> float | None:
        """A number or null, ``None`` when the field is absent (fields newer than some files)."""
        return self.number(key, optional=True) if key in self.obj else None

    def real(self, key: str) -> float:
        return float(self.get(key, is_number, "a number"))

    def array(self, key: str, check: Callable[[Any], bool], what: str) -> list[Any]:
        value = self.get(key, lambda v: isinstance(v, list), "a list")
        for i, v in enumerate(value):
            if not check(v):
                raise self.error(f"{key}[{i}]", f"must be {what}, got {type(v).__name__}")
        return list(value)

    def sub(self, key: str) -> Fields:
        return Fields(self.get(key, lambda v: isinstance(v, dict), "an object"), self.file, f"{self.prefix}{key}.")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: not valid JSON ({err})") from err
