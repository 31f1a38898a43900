"""What every kind of drift is built from: seeded keyed choices, identifier renaming, and walkers
over responses and response schemas (:mod:`envace.envs.drift_kinds` holds the kinds themselves).

Nothing here mutates its input: walkers build new objects, tool-block transforms work on deep copies.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from envace.types import JSON, ToolSchema, is_error

T = TypeVar("T")
SYNONYMS = {
    "get": "fetch", "set": "configure", "create": "make", "delete": "remove", "remove": "delete", "add": "insert",
    "send": "dispatch", "view": "show", "display": "show", "find": "search", "search": "lookup", "list": "enumerate",
    "check": "inspect", "post": "publish", "cancel": "revoke", "book": "reserve", "retrieve": "fetch",
    "compute": "calculate", "estimate": "approximate", "status": "state", "result": "value", "content": "body",
    "message": "note", "messages": "notes", "count": "total", "current": "present", "directory": "folder",
    "name": "label", "id": "identifier", "balance": "funds", "price": "cost", "cost": "price", "user": "member",
    "users": "members", "level": "amount", "lines": "rows", "matches": "hits", "working": "active",
}  # fmt: skip
_SNAKE = re.compile(r"[a-z]+(?:_[a-z]+)*")
_CAMEL = re.compile(r"[a-z]+(?:[A-Z]+[a-z]*)+")
_ORDER = 2**32


@dataclass(frozen=True)
class Chooser:
    """Seeded, keyed, stateless choices (SHA-256 of the seed and the key: the same in every process).

    >>> rng = Chooser(7)
    >>> rng.pick(["a", "b", "c"], "k") == Chooser(7).pick(["a", "b", "c"], "k")
    True
    >>> len({Chooser(s).pick(range(100), "k") for s in range(10)}) > 1
    True
    """

    seed: int

    def _digest(self, key: Iterable[object]) -> bytes:
        return hashlib.sha256(json.dumps([self.seed, *map(str, key)]).encode()).digest()

    def index(self, n: int, *key: object) -> int:
        """An index in ``range(n)`` for ``key``."""
        return int.from_bytes(self._digest(key)[:8], "big") % n

    def pick(self, options: Sequence[T], *key: object) -> T:
        """One of ``options`` for ``key``."""
        return options[self.index(len(options), *key)]

    def order(self, items: Iterable[str], *key: object) -> list[str]:
        """``items`` in a seeded order (each item's rank depends on it alone, so subsets keep it)."""
        return sorted(items, key=lambda item: self.index(_ORDER, *key, item))

    def token(self, *key: object) -> str:
        """12 hex digits for ``key``."""
        return self._digest(key).hex()[:12]


# --------------------------------------------------------------------------- names


def words(name: str) -> tuple[list[str], bool] | None:
    """The words of a snake_case or camelCase identifier and whether it was camelCase; ``None`` for
    anything else (data keys such as ``"USR002"``, ``"144756014165"`` or ``"MA(5)"`` are left alone).

    >>> words("current_directory_content"), words("currentACTemperature"), words("MA(5)")
    ((['current', 'directory', 'content'], False), (['current', 'ac', 'temperature'], True), None)
    """
    if _SNAKE.fullmatch(name):
        return name.split("_"), False
    if _CAMEL.fullmatch(name):
        return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", name)], True
    return None


def _join(parts: list[str], camel: bool) -> str:
    return parts[0] + "".join(p.capitalize() for p in parts[1:]) if camel else "_".join(parts)


def identifier_options(name: str) -> list[str]:
    """What an identifier may be renamed to: the other case style, its synonyms in either style;
    capitalised when nothing else differs. Empty for a name that is no identifier.

    >>> identifier_options("current_directory_content")
    ['currentDirectoryContent', 'present_folder_body', 'presentFolderBody']
    >>> identifier_options("result"), identifier_options("zipcode"), identifier_options("USR002")
    (['value'], ['Zipcode'], [])
    """
    found = words(name)
    if found is None:
        return []
    parts, camel = found
    synonyms = [SYNONYMS.get(p, p) for p in parts]
    candidates = [_join(parts, not camel), _join(synonyms, camel), _join(synonyms, not camel)]
    options = [o for o in dict.fromkeys(candidates) if o != name]
    return options or [name[0].upper() + name[1:]]


def renamed(name: str, rng: Chooser, kind: str) -> str:
    """``name`` as ``kind`` renames it (unchanged when it is no identifier)."""
    options = identifier_options(name)
    return rng.pick(options, kind, name) if options else name


# --------------------------------------------------------------------------- walkers


def rename_each_key(mapping: dict[str, Any], new: Callable[[str], str]) -> dict[str, Any]:
    """``mapping`` with each key renamed by ``new``; a key whose new name is taken keeps its own."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = new(key)
        out[key if name in mapping or name in out else name] = value
    return out


def map_dicts(value: JSON, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> JSON:
    """``value`` with ``fn`` applied to every dict in it, innermost first."""
    if isinstance(value, dict):
        return fn({k: map_dicts(v, fn) for k, v in value.items()})
    if isinstance(value, list):
        return [map_dicts(v, fn) for v in value]
    return value


def map_leaves(value: JSON, fn: Callable[[str | None, Any], Any], key: str | None = None) -> JSON:
    """``value`` with every scalar replaced by ``fn(its key, it)`` (the key of the dict holding it)."""
    if isinstance(value, dict):
        return {k: map_leaves(v, fn, k) for k, v in value.items()}
    if isinstance(value, list):
        return [map_leaves(v, fn, key) for v in value]
    return fn(key, value)


def unless_error(fn: Callable[[JSON, Chooser], JSON]) -> Callable[[JSON, Chooser], JSON]:
    """A response transform that leaves error observations as they are."""
    return lambda response, rng: response if is_error(response) else fn(response, rng)


def function_of(tool: ToolSchema) -> dict[str, Any]:
    return tool.get("function", tool)  # type: ignore[no-any-return]


def each_tool(tools: list[ToolSchema], fn: Callable[[dict[str, Any]], None]) -> list[ToolSchema]:
    """Deep copies of ``tools``, each one's function part changed in place by ``fn``."""
    out = copy.deepcopy(tools)
    for tool in out:
        fn(function_of(tool))
    return out


def with_response(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[list[ToolSchema]], list[ToolSchema]]:
    """A tool-block transform that rewrites each documented response schema (tau2 documents none)."""

    def change(f: dict[str, Any]) -> None:
        if isinstance(f.get("response"), dict):
            f["response"] = fn(f["response"])

    return lambda tools: each_tool(tools, change)


def schema_props(schema: JSON, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> JSON:
    """A response schema with ``fn`` applied to every ``properties`` dict in it (nested, in ``items``)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(schema.get("properties"), dict):
        out["properties"] = fn({k: schema_props(v, fn) for k, v in schema["properties"].items()})
    if "items" in schema:
        out["items"] = schema_props(schema["items"], fn)
    return out


def noted(tools: list[ToolSchema], note: str | Callable[[dict[str, Any]], str | None]) -> list[ToolSchema]:
    """``tools`` with ``note`` appended to each description (``note(function)``: the note of one tool,
    ``None`` for none)."""

    def add(f: dict[str, Any]) -> None:
        text = note if isinstance(note, str) else note(f)
        if text:
            f["description"] = f"{f.get('description') or ''} {text}".strip()

    return each_tool(tools, add)


def schema_fields(schema: JSON) -> list[tuple[str, dict[str, Any]]]:
    """Every ``(key, property schema)`` of a response schema, nested ones and those in ``items`` too.

    >>> [k for k, _ in schema_fields({"properties": {"a": {"properties": {"b": {}}}, "c": {"items": {
    ...     "properties": {"d": {}}}}}})]
    ['a', 'b', 'c', 'd']
    """
    out: list[tuple[str, dict[str, Any]]] = []
    if not isinstance(schema, dict):
        return out
    for key, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, dict):
            out += [(key, prop), *schema_fields(prop)]
    return out + schema_fields(schema.get("items"))


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
