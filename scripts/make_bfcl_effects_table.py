"""Derive the pinned per-tool effects table of the BFCL multi-turn tools
(:mod:`envace.rewards.bfcl_effects_table`, read by :mod:`envace.rewards.bfcl_effects`) by running
environments, offline. The reward itself never executes anything, so this generator is not part of
the package.

:func:`derive_effects` runs every gold call of the 800 BFCL multi-turn tasks in its real state, with
the instance's attribute reads and writes recorded (a read counts only before the call has replaced
the attribute; a write is a changed attribute, ``random.Random`` state included, so writes through
aliases such as ``GorillaFileSystem._current_dir`` are seen) and repeated on a copy; it adds what the
class source can reach on paths the gold never takes (every ``self.<attr>`` of the method and the
methods it calls, unless every run replaced it before reading; every ``self.<attr>`` that is assigned
or mutated). ``tests/rewards/test_bfcl_effects.py`` re-derives the table and checks, by execution,
that pairs declared commuting do commute. Regenerate with::

    .venv/bin/python scripts/make_bfcl_effects_table.py > src/envace/rewards/bfcl_effects_table.py
    .venv/bin/ruff format src/envace/rewards/bfcl_effects_table.py
"""

from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import json
import random
import textwrap
from collections import defaultdict
from typing import Any

from envace.data.sources.bfcl import load_multi_turn
from envace.envs.bfcl import BFCLEnvironment, public_state, to_json
from envace.rewards.bfcl import tool_classes

Effects = dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]]
#: method names that mutate a list, dict or set in place
MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "add", "discard"}
    | {"sort", "reverse"}
)

_LOG: dict[str, set[str]] | None = None
_RECORDING: dict[type, type] = {}


def _recording(cls: type) -> type:
    """A subclass of an API class that logs the first touch of each instance attribute in ``_LOG``."""
    if cls not in _RECORDING:

        def get(self: Any, name: str) -> Any:
            if _LOG is not None and name in object.__getattribute__(self, "__dict__") and name not in _LOG["set"]:
                _LOG["read"].add(name)
            return object.__getattribute__(self, name)

        def put(self: Any, name: str, value: Any) -> None:
            if _LOG is not None and name not in _LOG["read"]:
                _LOG["set"].add(name)
            object.__setattr__(self, name, value)

        _RECORDING[cls] = type(cls.__name__, (cls,), {"__getattribute__": get, "__setattr__": put})
    return _RECORDING[cls]


def _fingerprint(value: Any) -> Any:
    if isinstance(value, random.Random):
        return ("random", value.getstate())
    return (id(value) if hasattr(value, "__dict__") else None, json.dumps(to_json(value), sort_keys=True, default=str))


def _root(node: ast.AST) -> str | None:
    """``x`` for an expression ``self.x[...].y...``, else ``None``."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr
        node = node.value
    return None


def static_effects(cls: type) -> dict[str, tuple[set[str], set[str]]]:
    """``method -> (attributes it names, attributes it assigns or mutates)``, through the methods it calls."""
    (tree,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    methods = {f.name: f for f in getattr(tree, "body", []) if isinstance(f, ast.FunctionDef)}
    direct: dict[str, tuple[set[str], set[str], set[str]]] = {}
    for name, fn in methods.items():
        named: set[str] = set()
        stored: set[str] = set()
        called: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                (called if node.attr in methods else named).add(node.attr)
            targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                stored |= {r for t in targets if t is not None and (r := _root(t)) and r not in methods}
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                stored |= {r for r in [_root(node.func.value)] if r and r not in methods}
        direct[name] = (named, stored, called)

    def closure(name: str, seen: set[str]) -> tuple[set[str], set[str]]:
        seen.add(name)
        named, stored, called = (set(x) for x in direct[name])
        for other in called - seen:
            n, s = closure(other, seen)
            named, stored = named | n, stored | s
        return named, stored

    return {name: closure(name, set()) for name in methods}


def derive_effects(tasks: list[Any]) -> tuple[Effects, dict[str, tuple[str, ...]]]:
    """Run every gold call of ``tasks`` (BFCL multi-turn) in its real state and return
    ``(EFFECTS, NON_IDEMPOTENT)`` as pinned in :mod:`envace.rewards.bfcl_effects_table`."""
    global _LOG
    read: dict[tuple[str, str], set[str]] = defaultdict(set)
    wrote: dict[tuple[str, str], set[str]] = defaultdict(set)
    set_first: dict[tuple[str, str], set[str]] = {}
    repeat_changes: set[tuple[str, str]] = set()
    classes: dict[str, type] = {}
    for task in tasks:
        env = BFCLEnvironment.from_task(task)
        instances, owner = env.instances(), tool_classes(tuple(task.env["involved_classes"]))
        for call in [c for turn in task.gold for c in turn]:
            key = (owner[call.name], call.name)
            obj = instances[key[0]]
            cls = classes.setdefault(key[0], type(obj))
            before = {k: _fingerprint(v) for k, v in vars(obj).items()}
            _LOG, obj.__class__ = {"read": set(), "set": set()}, _recording(cls)
            with contextlib.suppress(Exception):  # a failing gold call still reads (and may write)
                getattr(obj, call.name)(**copy.deepcopy(call.arguments))
            obj.__class__, log, _LOG = cls, _LOG, None
            after = {k: _fingerprint(v) for k, v in vars(obj).items()}
            read[key] |= log["read"]
            wrote[key] |= {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
            set_first[key] = log["set"] & set_first.get(key, log["set"])  # replaced before read in every run
            twin = copy.deepcopy(obj)
            state = public_state(twin)
            with contextlib.suppress(Exception):
                getattr(twin, call.name)(**copy.deepcopy(call.arguments))
            if public_state(twin) != state:
                repeat_changes.add(key)
    effects: Effects = {}
    for class_name in sorted(classes):
        static = static_effects(classes[class_name])
        tools = {}
        for c, tool in sorted(k for k in read if k[0] == class_name):
            named, stored = static.get(tool, (set(), set()))
            r = read[c, tool] | (named - set_first[c, tool])
            tools[tool] = (tuple(sorted(r)), tuple(sorted(wrote[c, tool] | stored)))
        effects[class_name] = tools
    idem = {c: tuple(sorted(t for k, t in repeat_changes if k == c)) for c in sorted({k for k, _ in repeat_changes})}
    return effects, idem


def table_source(effects: Effects, idem: dict[str, tuple[str, ...]]) -> str:
    """The Python source of :mod:`envace.rewards.bfcl_effects_table` for these tables."""
    lines = [
        '"""Generated by ``scripts/make_bfcl_effects_table.py`` (see that script); do not edit by hand."""',
        "",
        "# class -> tool -> (attributes read, attributes written)",
        "EFFECTS: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {",
    ]
    for class_name, tools in effects.items():
        lines.append(f"    {class_name!r}: {{")
        lines += [f"        {t!r}: ({r!r}, {w!r})," for t, (r, w) in tools.items()]
        lines.append("    },")
    lines += ["}", "# class -> tools whose repeat changes the public state again"]
    lines += ["NON_IDEMPOTENT: dict[str, tuple[str, ...]] = {"]
    lines += [f"    {c!r}: {t!r}," for c, t in idem.items()]
    return "\n".join([*lines, "}", ""])


if __name__ == "__main__":
    print(table_source(*derive_effects(load_multi_turn())), end="")
