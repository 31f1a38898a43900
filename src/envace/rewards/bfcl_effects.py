"""What each BFCL multi-turn tool reads and writes of its API class's state: static facts for the
env-free reward (:mod:`envace.rewards.bfcl`), derived offline and pinned.

The reward never executes anything (DESIGN.md §3.5). It only needs two facts per tool, which are
properties of the API's code, not of an episode:

* **reads / writes** — the instance attributes a call may look at before changing them (its inputs)
  and those it may change. Two calls on one instance *commute* (either order gives the same results
  and the same state) when neither writes what the other reads, and they do not both write an
  *observable* attribute (public, i.e. compared by bfcl-eval's state checker, or read by some tool).
  :func:`ordered` says whether the gold order of two calls matters.
* **non-idempotent** — repeating the call right after itself changes the public state again (a
  second order, tweet, booking, message, token), so a duplicate is not harmless.

:func:`derive_effects` computes both by running every gold call of the 800 BFCL multi-turn tasks in
its real state, with the instance's attribute reads and writes recorded (a read counts only before
the call has replaced the attribute; a write is a changed attribute, ``random.Random`` state
included, so writes through aliases such as ``GorillaFileSystem._current_dir`` are seen) and
repeated on a copy; it adds what the class source can reach on paths the gold never takes (every
``self.<attr>`` of the method and the methods it calls, unless every run replaced it before reading;
every ``self.<attr>`` that is assigned or mutated). The result is pinned in
:mod:`envace.rewards.bfcl_effects_table`; ``tests/rewards/test_bfcl_effects.py`` re-derives it and
checks, by execution, that pairs declared commuting do commute. Regenerate with::

    .venv/bin/python -m envace.rewards.bfcl_effects > src/envace/rewards/bfcl_effects_table.py
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
from functools import cache
from typing import Any

from envace.rewards.bfcl_effects_table import EFFECTS, NON_IDEMPOTENT

Effects = dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]]
#: method names that mutate a list, dict or set in place
MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem", "add", "discard"}
    | {"sort", "reverse"}
)


@cache
def _observable(class_name: str) -> frozenset[str]:
    tools = EFFECTS.get(class_name, {})
    written = {a for _, w in tools.values() for a in w}
    read = {a for r, _ in tools.values() for a in r}
    return frozenset({a for a in written if not a.startswith("_")} | (read & written))


def ordered(class_name: str, a: str, b: str) -> bool:
    """Whether calls of tools ``a`` and ``b`` on one instance of ``class_name`` may give other results
    or another state when swapped (True for a tool the table does not know).

    >>> ordered("TravelAPI", "get_flight_cost", "set_budget_limit"), ordered("GorillaFileSystem", "cd", "ls")
    (False, True)
    """
    tools = EFFECTS.get(class_name, {})
    if a not in tools or b not in tools:
        return True
    (ra, wa), (rb, wb) = tools[a], tools[b]
    return bool(set(wa) & set(rb) or set(wb) & set(ra) or set(wa) & set(wb) & _observable(class_name))


def reads(class_name: str, tool: str) -> frozenset[str] | None:
    """The attributes ``tool`` reads (``None``: unknown tool)."""
    known = EFFECTS.get(class_name, {}).get(tool)
    return None if known is None else frozenset(known[0])


def writes(class_name: str, tool: str) -> frozenset[str] | None:
    """The attributes ``tool`` writes (``None``: unknown tool)."""
    known = EFFECTS.get(class_name, {}).get(tool)
    return None if known is None else frozenset(known[1])


def non_idempotent(class_name: str, tool: str) -> bool:
    """Whether a repeat of the call changes the public state again (in some gold state)."""
    return tool in NON_IDEMPOTENT.get(class_name, ())


# --------------------------------------------------------------------------- derivation (offline only)

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
    from envace.envs.bfcl import to_json

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
    from envace.envs.bfcl import BFCLEnvironment, public_state
    from envace.rewards.bfcl import tool_classes

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
        '"""Generated by ``python -m envace.rewards.bfcl_effects`` (see that module); do not edit by hand."""',
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
    from envace.data.sources.bfcl import load_multi_turn

    print(table_source(*derive_effects(load_multi_turn())), end="")
