"""The agreement study's per-class perturbations (issue 30): each edits a gold call of one API class.

Drawn once per API class (:data:`CLASS_KINDS`, the class of the call edited), so that every class
is probed with each kind:

* ``repeat_every_turn`` — every turn's gold calls written twice (``a, b, a, b``), in a task whose gold
  calls the class;
* ``move_into_empty`` — a gold call moved into an adjacent turn whose gold is empty (the end of the
  previous turn, or the start of the next), where its tool is visible there;
* ``swap_adjacent`` — a call swapped with the next, different call of its turn;
* ``repeat_write`` — a gold write (of compared state) repeated later in its turn, right after itself
  or after other calls;
* ``case_arg`` — a free string argument in another case (upper, lower or title case);
* ``off_by_one`` — a number argument one more or one less.

Each edit is kept only where the call still fits the task's tool schemas.
"""

from __future__ import annotations

from perturb_calls import _owner, _props, _valid, _visible, _writes_state

from envace.types import Task, ToolCall

Script = list[list[ToolCall]]
CLASS_KINDS = ("repeat_every_turn", "move_into_empty", "swap_adjacent", "repeat_write", "case_arg", "off_by_one")


def _with_turn(script: Script, turn: int, calls: list[ToolCall]) -> Script:
    return [list(calls) if t == turn else list(c) for t, c in enumerate(script)]


def _cases(value: str) -> list[str]:
    return [v for v in dict.fromkeys((value.upper(), value.lower(), value.title())) if v != value]


def _arg_variants(task: Task, kind: str, t: int, call: ToolCall) -> list[tuple[ToolCall, str]]:
    props = _props(_visible(task, t).get(call.name))
    out = []
    for k, v in call.arguments.items():
        prop = props.get(k) or {}
        if kind == "case_arg" and isinstance(v, str) and not prop.get("enum"):
            news: list[object] = list(_cases(v))
        elif kind == "off_by_one" and isinstance(v, int | float) and not isinstance(v, bool):
            news = [v + 1, v - 1]
        else:
            continue
        out += [(ToolCall(call.name, {**call.arguments, k: n}), f"{k}={v!r}->{n!r}") for n in news]
    return [(new, note) for new, note in out if _valid(task, t, new)]


def _site_edits(task: Task, kind: str, t: int, i: int) -> list[tuple[Script, str]]:
    gold, turn, call = task.gold, task.gold[t], task.gold[t][i]
    head = f"turn {t} call {i} {call.name}"
    if kind == "move_into_empty":
        out = []
        for to in (t - 1, t + 1):
            if 0 <= to < len(gold) and not gold[to] and _valid(task, to, call):
                script = _with_turn(gold, t, [c for n, c in enumerate(turn) if n != i])
                script[to] = [call]
                out.append((script, f"{head}: moved into empty turn {to}"))
        return out
    if kind == "swap_adjacent":
        if i + 1 < len(turn) and turn[i] != turn[i + 1]:
            return [(_with_turn(gold, t, [*turn[:i], turn[i + 1], call, *turn[i + 2 :]]), f"{head}: swapped")]
        return []
    if kind == "repeat_write":
        if not _writes_state(task, call):
            return []
        return [
            (_with_turn(gold, t, [*turn[:j], call, *turn[j:]]), f"{head}: repeated at {j}")
            for j in range(i + 1, len(turn) + 1)
        ]
    return [
        (_with_turn(gold, t, [*turn[:i], new, *turn[i + 1 :]]), f"{head}: {note}")
        for new, note in _arg_variants(task, kind, t, call)
    ]


def class_edits(task: Task, kind: str, api_class: str) -> list[tuple[Script, str]]:
    """Every candidate edit of ``kind`` (one of :data:`CLASS_KINDS`) of a gold call of ``api_class``."""
    owner = _owner(task)
    sites = [(t, i) for t, turn in enumerate(task.gold) for i, c in enumerate(turn) if owner.get(c.name) == api_class]
    if kind == "repeat_every_turn":
        return [([[*c, *c] for c in task.gold], "every turn's calls twice")] if sites else []
    return [edit for t, i in sites for edit in _site_edits(task, kind, t, i)]
