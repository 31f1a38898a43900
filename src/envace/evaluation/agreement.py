"""Agreement of the env-free BFCL multi-turn reward with bfcl-eval's official ``multi_turn_checker``.

The reward (:func:`envace.rewards.bfcl.bfcl_multi_turn`) compares calls with the gold; the official
checker executes both and compares the API instances' states and the execution results after each
turn. This study harness builds episodes whose calls are the gold with one :func:`perturb`-ation
(:data:`KINDS`: argument edits, dropped, swapped, moved, repeated and extra calls, extra writes with
other arguments before, between and after the gold calls in every API class), written by
:class:`ScriptEngine` into the ordinary rollout loop (so a real environment executes them), scores
each episode both ways (:func:`score_episode`: the reward, and the evaluation's own
:func:`~envace.evaluation.bfcl.official_verdict`) and counts the 2x2 table (:func:`confusion`). It
rolls episodes out, so it lives with the evaluation, not with the rewards (which run nothing).
``scripts/reward_agreement.py`` runs the measurement; ``docs/rewards.md`` explains the disagreements.
"""

from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from envace.data.sources.bfcl import call_string
from envace.evaluation.bfcl import official_verdict
from envace.protocol import tool_name
from envace.protocol.parse import validate_call
from envace.rewards.bfcl import bfcl_multi_turn, calls_equivalent, tool_classes
from envace.rewards.bfcl_effects import call_effects, public
from envace.rewards.bfcl_effects_table import EFFECTS
from envace.rollout.engine import Request, Sample
from envace.rollout.reference import ScriptedEngine, calls_once_per_turn
from envace.types import Message, Task, ToolCall, ToolSchema

Script = list[list[ToolCall]]
KINDS = (
    "gold",
    "change_arg",
    "drop_arg",
    "drop_call",
    "swap_calls",
    "extra_readonly",
    "duplicate_call",
    "replace_tool",
    "equivalent_value",
    "extra_write_before",
    "extra_write_between",
    "extra_write_after",
    "move_earlier",
    "move_later",
    "duplicate_write",
    "repeat_turn",
    "same_tool_swap",
    "arg_case",
    "arg_numeric",
    "arg_other_value",
)
#: kinds drawn once per API class (the class of the call they copy), so that every class is probed
BY_CLASS = ("extra_write_before", "extra_write_between", "extra_write_after")
#: like them, but the added call changes nothing where it runs (refused, or redundant): a probe
PER_CLASS = (*BY_CLASS, "noop_write")
#: probes of known differences (docs/rewards.md), not in the default mix: a read-only call in an empty gold
#: turn; an ``integer`` argument written as a float (a type error to bfcl-eval's ast_checker and to our reward);
#: an extra write that changes nothing where it runs (the API refuses it, or it is redundant)
PROBES = ("call_in_empty_turn", "float_for_integer", "noop_write")
#: argument-free methods that leave an API instance's state unchanged (tested on fresh instances)
READ_ONLY: dict[str, tuple[str, ...]] = {
    "GorillaFileSystem": ("pwd", "ls"),
    "MessageAPI": ("list_users",),
    "TwitterAPI": ("posting_get_login_status",),
    "TicketAPI": ("ticket_get_login_status",),
    "TradingBot": ("get_current_time", "trading_get_login_status"),
    "TravelAPI": ("list_all_airports", "travel_get_login_status"),
    "VehicleControlAPI": ("check_tire_pressure", "get_current_speed"),
}


@dataclass(frozen=True)
class Perturbation:
    """The calls to write per user turn, what was changed, and (for :data:`PER_CLASS` kinds) the API
    class and place of the added call."""

    kind: str
    script: Script
    note: str
    api_class: str = ""
    #: ``(turn, index)`` of the call a :data:`PER_CLASS` kind adds
    added: tuple[int, int] | None = None


def _visible(task: Task, turn: int) -> dict[str, ToolSchema]:
    return {tool_name(t): t for t in task.tools_at(turn)}


def _valid(task: Task, turn: int, call: ToolCall) -> bool:
    return validate_call(call, task.tools_at(turn)) is None


def _props(schema: ToolSchema | None) -> dict[str, Any]:
    fn = (schema or {}).get("function", schema or {})
    return dict((fn.get("parameters") or {}).get("properties") or {})


def _sites(script: Script) -> list[tuple[int, int]]:
    return [(t, i) for t, turn in enumerate(script) for i in range(len(turn))]


def _with_turn(script: Script, turn: int, calls: list[ToolCall]) -> Script:
    return [list(calls) if t == turn else list(c) for t, c in enumerate(script)]


def _changed(value: Any, prop: dict[str, Any], rng: random.Random) -> Any:
    """A different value of the same type (another enum member where there is an enum), or ``None``."""
    others = [v for v in prop.get("enum") or [] if v != value]
    if others:
        return rng.choice(others)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + (1 if isinstance(value, int) else 1.5)
    if isinstance(value, str):
        return value + "_2" if value else "x"
    if isinstance(value, list) and value:
        return value[:-1]
    return None


def _flipped(value: Any) -> Any:
    """The same number in the other JSON spelling (5 <-> 5.0; lists element-wise), or ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list) and value and all(_flipped(v) is not None for v in value):
        return [_flipped(v) for v in value]
    return None


def _read_only(task: Task, turn: int) -> list[str]:
    visible = _visible(task, turn)
    classes = (task.env or {}).get("involved_classes", [])
    return [n for c in classes for n in READ_ONLY.get(c, ()) if n in visible]


def _owner(task: Task) -> dict[str, str]:
    return tool_classes(tuple((task.env or {}).get("involved_classes") or ()))


def _writes_state(task: Task, call: ToolCall) -> bool:
    """Whether the call may change state that the official checker compares (by the effects table)."""
    effects = call_effects(_owner(task).get(call.name, ""), call)
    return effects is not None and any(public(k) for k in effects[1])


def _gold_values(task: Task, key: str, like: Any) -> list[Any]:
    """The other values of ``like``'s type that the task's gold passes as argument ``key``."""
    seen = [c.arguments[key] for turn in task.gold for c in turn if key in c.arguments]
    return [v for n, v in enumerate(seen) if type(v) is type(like) and v != like and v not in seen[:n]]


def _enum(prop: dict[str, Any]) -> list[Any]:
    """The allowed values of an argument (or of its items): the schema's ``enum``, else the
    ``[Enum]: [...]`` list that BFCL's descriptions carry."""
    if prop.get("enum"):
        return list(prop["enum"])
    items = prop.get("items") or {}
    if items.get("enum"):
        return list(items["enum"])
    found = re.search(r"\[Enum\]: (\[[^\]]*\])", str(prop.get("description", "")))
    try:
        values = json.loads(found.group(1)) if found else []
    except json.JSONDecodeError:
        return []
    return values if isinstance(values, list) else []


def _config_names(task: Task, api_class: str) -> list[str]:
    """Identifier-like strings of the class's initial state (dict keys and short values without
    spaces below its attributes: file names, user and card ids, airports), first seen first."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and 0 < len(value) <= 40 and " " not in value and value not in out:
            out.append(value)

    for value in (((task.env or {}).get("initial_config") or {}).get(api_class) or {}).values():
        walk(value)  # below the attributes: their names are no values
    return out


def _other_values(task: Task, key: str, value: Any, prop: dict[str, Any], api_class: str) -> list[Any]:
    """Plausible other values of an argument, of its type: the other boolean; the other allowed
    values (:func:`_enum`; for a list of them, the list without one item, or one item it lacks); a
    number +1 (an int) or halved (a float, so that a bounded one stays in range); for a string
    another value the task's gold passes as this argument, else a name from the class's initial
    state (:func:`_config_names`), else the string with ``_2`` appended."""
    if isinstance(value, bool):
        return [not value]
    allowed = _enum(prop)
    if isinstance(value, list):
        smaller = [[v for v in value if v != x] for x in value] if len(value) > 1 else []
        return smaller + [[x] for x in allowed if x not in value] + _gold_values(task, key, value)
    if allowed:
        return [v for v in allowed if v != value]
    if isinstance(value, int | float):
        return [value + 1 if isinstance(value, int) else value / 2 if value else 1.0]
    if not isinstance(value, str):
        return []
    names = [v for v in _config_names(task, api_class) if v != value]
    return _gold_values(task, key, value) or names or [value + "_2" if value else "x"]


def _edited(value: Any, kind: str, task: Task, key: str, prop: dict[str, Any]) -> list[Any]:
    """The argument edits of ``kind``: ``arg_case`` the letters' case of a free string, ``arg_numeric``
    a number changed (an int +1, a float x1.1), ``arg_other_value`` another value the gold passes as
    this argument (another enum member for an enum)."""
    if kind == "arg_case":
        if not isinstance(value, str) or prop.get("enum") or value.upper() == value.lower():
            return []
        return [value.upper() if value != value.upper() else value.lower()]
    if kind == "arg_numeric":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return []
        return [value + 1 if isinstance(value, int) else round(value * 1.1, 6) if value else 0.5]
    if kind == "arg_other_value" and isinstance(value, str | list):
        return [v for v in _enum(prop) if v != value and type(v) is type(value)] or _gold_values(task, key, value)
    return []


def _arg_edits(task: Task, kind: str, t: int, call: ToolCall, rng: random.Random) -> list[tuple[ToolCall, str]]:
    """Valid versions of gold call ``call`` of turn ``t`` with one argument edited by ``kind``."""
    props = _props(_visible(task, t).get(call.name))
    out: list[tuple[ToolCall, str]] = []
    for k, v in call.arguments.items():
        prop = props.get(k) or {}
        if kind == "change_arg":
            values = [] if (changed := _changed(v, prop, rng)) is None else [changed]
        elif kind == "drop_arg":
            out.append((ToolCall(call.name, _without(call.arguments, k)), f"dropped {k}"))
            continue
        elif kind == "float_for_integer":
            values = [float(v)] if type(v) is int and prop.get("type") == "integer" else []
        else:
            values = _edited(v, kind, task, k, prop)
        out += [(ToolCall(call.name, {**call.arguments, k: new}), f"{k}={v!r}->{new!r}") for new in values]
    return [(new, note) for new, note in out if kind == "drop_arg" or _valid(task, t, new)]


ARG_KINDS = ("change_arg", "drop_arg", "float_for_integer", "arg_case", "arg_numeric", "arg_other_value")


def _turn_edits(task: Task, kind: str, t: int, i: int, rng: random.Random) -> list[tuple[list[ToolCall], str]]:
    """Candidate new versions of gold turn ``t`` that change its call ``i`` by ``kind``."""
    turn, call = task.gold[t], task.gold[t][i]
    before, after = turn[:i], turn[i + 1 :]
    if kind in ARG_KINDS:
        return [([*before, new, *after], note) for new, note in _arg_edits(task, kind, t, call, rng)]
    if kind == "drop_call":
        return [([*before, *after], "dropped")]
    if kind == "duplicate_call":
        return [([*before, call, call, *after], "duplicated")]
    if kind == "duplicate_write":  # repeated later in the turn, not right after itself
        at = list(range(i + 2, len(turn) + 1))
        if not at or not _writes_state(task, call):
            return []
        j = rng.choice(at)
        return [([*turn[:j], call, *turn[j:]], f"repeated at {j}")]
    if kind == "swap_calls":
        ok = i + 1 < len(turn) and turn[i] != turn[i + 1]
        return [([*before, turn[i + 1], call, *turn[i + 2 :]], f"swapped with {turn[i + 1].name}")] if ok else []
    if kind == "same_tool_swap":
        schema = _visible(task, t).get(call.name)
        return [
            ([*turn[:i], turn[j], *turn[i + 1 : j], call, *turn[j + 1 :]], f"swapped with call {j}")
            for j in range(i + 1, len(turn))
            if turn[j].name == call.name and not calls_equivalent(call, turn[j], schema)
        ]
    if kind == "replace_tool":
        return [([*before, new, *after], f"-> {call_string(new)}") for new in _replacements(task, t, call)]
    if kind == "equivalent_value":
        props = _props(_visible(task, t).get(call.name))
        return [([*before, new, *after], note) for new, note in _equivalents(task, t, call, props)]
    return []


def _without(arguments: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if k != key}


def _extra_writes(task: Task, t: int, api_class: str, rng: random.Random) -> list[tuple[ToolCall, str]]:
    """Copies of turn ``t``'s gold calls on ``api_class`` that change compared state, each with one
    argument given another plausible value (:func:`_other_values`, one picked per argument) and
    equivalent to no gold call of the turn."""
    out = []
    for call in task.gold[t]:
        if _owner(task).get(call.name) != api_class or not _writes_state(task, call):
            continue
        schema = _visible(task, t).get(call.name)
        props = _props(schema)
        for k, v in call.arguments.items():
            news = [
                ToolCall(call.name, {**call.arguments, k: o})
                for o in _other_values(task, k, v, props.get(k) or {}, api_class)
            ]
            news = [
                n for n in news if _valid(task, t, n) and not any(calls_equivalent(g, n, schema) for g in task.gold[t])
            ]
            if news:
                new = rng.choice(news)
                out.append((new, f"{call.name} {k}={v!r}->{new.arguments[k]!r}"))
    return out


def _changes_state(task: Task, script: Script, t: int, pos: int) -> bool:
    """Whether call ``pos`` of turn ``t`` of ``script`` changes the compared (public) state when the
    script runs up to it in the real environment (the study may execute; the reward never does)."""
    from envace.envs.bfcl import BFCLEnvironment

    env = BFCLEnvironment.from_task(task)
    try:
        for turn, calls in enumerate(script[: t + 1]):
            env.set_turn(turn)
            for call in calls if turn < t else calls[:pos]:
                env.execute(call, validate=False)
        before = env.snapshot()
        env.execute(script[t][pos], validate=False)
        return bool(env.snapshot() != before)
    finally:
        env.close()


def _turn_level_edits(task: Task, kind: str, api_class: str, rng: random.Random) -> list[tuple[Script, str]]:
    """Edits that add calls to a turn: extra writes before, between or after the gold calls that
    change the state where they run (``noop_write``: that change nothing there, refused or
    redundant), a turn's calls written twice, and read-only calls (in gold turns or empty ones)."""
    gold, out = task.gold, []
    for t, turn in enumerate(gold):
        if kind == "repeat_turn" and any(_writes_state(task, c) for c in turn):
            out.append((_with_turn(gold, t, [*turn, *turn]), f"turn {t}: its {len(turn)} calls twice"))
        elif kind in (*BY_CLASS, "noop_write"):
            positions = {"extra_write_before": [0], "extra_write_after": [len(turn)]}
            at = positions.get(kind, list(range(1, len(turn))) if kind != "noop_write" else list(range(len(turn) + 1)))
            for new, note in _extra_writes(task, t, api_class, rng) if at else []:
                pos = rng.choice(at)
                script = _with_turn(gold, t, [*turn[:pos], new, *turn[pos:]])
                if _changes_state(task, script, t, pos) == (kind != "noop_write"):
                    out.append((script, f"turn {t}: {note} at {pos}"))
        elif kind in ("extra_readonly", "call_in_empty_turn") and bool(turn) == (kind == "extra_readonly"):
            for name in _read_only(task, t):
                pos = rng.randint(0, len(turn))
                calls = [*turn[:pos], ToolCall(name), *turn[pos:]]
                out.append((_with_turn(gold, t, calls), f"turn {t}: {name}() inserted at {pos}"))
    return out


def _moves(task: Task, kind: str) -> list[tuple[Script, str]]:
    """Gold calls moved to the end of the previous turn (``move_earlier``) or the start of the next
    (``move_later``), where that turn has gold calls and the tool is visible there."""
    step = -1 if kind == "move_earlier" else 1
    gold, out = task.gold, []
    for t, i in _sites(gold):
        to = t + step
        if not 0 <= to < len(gold) or not gold[to] or not _valid(task, to, gold[t][i]):
            continue
        script = _with_turn(gold, t, [c for n, c in enumerate(gold[t]) if n != i])
        script[to] = [*gold[to], gold[t][i]] if step < 0 else [gold[t][i], *gold[to]]
        out.append((script, f"turn {t} call {i} {gold[t][i].name}: moved to turn {to}"))
    return out


def _edits(task: Task, kind: str, rng: random.Random, api_class: str = "") -> list[tuple[Script, str]]:
    """Every candidate edit of ``kind`` of the task's gold, with a note naming it."""
    if kind in ("move_earlier", "move_later"):
        return _moves(task, kind)
    if kind in (*BY_CLASS, "noop_write", "repeat_turn", "extra_readonly", "call_in_empty_turn"):
        return _turn_level_edits(task, kind, api_class, rng)
    gold = task.gold
    return [
        (_with_turn(gold, t, calls), f"turn {t} call {i} {gold[t][i].name}: {note}")
        for t, i in _sites(gold)
        for calls, note in _turn_edits(task, kind, t, i, rng)
    ]


def _replacements(task: Task, turn: int, call: ToolCall) -> list[ToolCall]:
    """Valid calls of another visible tool that take the call's arguments (or none at all)."""
    out = []
    for name, schema in _visible(task, turn).items():
        if name == call.name:
            continue
        props = _props(schema)
        new = ToolCall(name, {k: v for k, v in call.arguments.items() if k in props})
        if (new.arguments or name in _read_only(task, turn)) and _valid(task, turn, new):
            out.append(new)
    return out


def _equivalents(task: Task, turn: int, call: ToolCall, props: dict[str, Any]) -> list[tuple[ToolCall, str]]:
    """The call with one argument spelled another way that the reward counts as equal
    (:func:`~envace.rewards.bfcl.calls_equivalent`): a number as int/float (not a float for an
    ``integer``), an omitted default written out, a value equal to its default omitted."""
    out = []
    for k, v in call.arguments.items():
        flipped = _flipped(v)
        if flipped is not None:
            out.append((ToolCall(call.name, {**call.arguments, k: flipped}), f"{k}={v!r}->{flipped!r}"))
        if "default" in props.get(k, {}) and props[k]["default"] == v:
            out.append((ToolCall(call.name, _without(call.arguments, k)), f"{k} omitted"))
    for k, p in props.items():
        if k not in call.arguments and isinstance(p, dict) and "default" in p and p["default"] != "None":
            out.append((ToolCall(call.name, {**call.arguments, k: p["default"]}), f"{k}={p['default']!r} written"))
    schema = _visible(task, turn).get(call.name)
    return [(new, note) for new, note in out if _valid(task, turn, new) and calls_equivalent(call, new, schema)]


def perturb(task: Task, kind: str, rng: random.Random, api_class: str = "") -> Perturbation | None:
    """The task's gold with one change of ``kind`` (one of :data:`KINDS` or :data:`PROBES`),
    picked with ``rng``; ``None`` when the kind does not apply to this task's gold. The
    :data:`PER_CLASS` kinds copy a call of ``api_class``.

    >>> t = Task(id="x", benchmark="bfcl", gold=[[ToolCall("cd", {"folder": "a"}), ToolCall("pwd")]],
    ...          tools=[{"name": "cd", "parameters": {"properties": {"folder": {"type": "string"}}}},
    ...                 {"name": "pwd", "parameters": {"properties": {}}}])
    >>> [c.name for c in perturb(t, "swap_calls", random.Random(0)).script[0]]
    ['pwd', 'cd']
    """
    if kind == "gold":
        return Perturbation(kind, copy.deepcopy(task.gold), "unperturbed")
    if kind not in KINDS + PROBES:
        raise ValueError(f"unknown perturbation {kind!r}; known: {', '.join(KINDS + PROBES)}")
    edits = _edits(task, kind, rng, api_class)
    if not edits:
        return None
    script, note = rng.choice(edits)
    if kind not in PER_CLASS:
        return Perturbation(kind, copy.deepcopy(script), note)
    return Perturbation(kind, copy.deepcopy(script), note, api_class, _inserted(task.gold, script))


def _inserted(gold: Script, script: Script) -> tuple[int, int]:
    """``(turn, index)`` of the one call ``script`` adds to the gold."""
    t = next(t for t, calls in enumerate(script) if len(calls) != len(gold[t]))
    return t, next((i for i, (a, b) in enumerate(zip(script[t], gold[t], strict=False)) if a != b), len(gold[t]))


@dataclass
class ScriptEngine(ScriptedEngine):
    """Writes each user turn's scripted calls (by task id) in one act step, then a closing text,
    as :class:`~envace.rollout.reference.OracleEngine` does with the gold.

    Args:
        scripts: ``task id -> calls per user turn``; tasks of one rollout must be distinct.
    """

    scripts: dict[str, Script] = field(default_factory=dict)

    def text_for(self, episode: Any) -> str:
        script = self.scripts[episode.task.id]
        return calls_once_per_turn(episode, script[episode.turn] if episode.turn < len(script) else [])

    def write(self, requests: list[Request]) -> list[Sample]:
        samples = super().write(requests)
        for r, s in zip(requests, samples, strict=True):
            if len(s.ids) >= r.max_new_tokens:  # the base class would cut the script short
                raise ValueError(f"a scripted turn does not fit in max_new_tokens={r.max_new_tokens}")
        return samples


@dataclass
class Row:
    """One episode scored both ways."""

    task_id: str
    category: str
    source: str
    kind: str
    note: str
    ours: bool
    official: bool
    turns: list[bool]
    error_type: str | None = None
    error_message: str | None = None
    n_calls: int = 0
    api_class: str = ""
    failures: list[str] = field(default_factory=list)
    #: for an added call: "refused" when the API answered it with an error, else "applied"
    added: str = ""

    @property
    def agree(self) -> bool:
        return self.ours == self.official


def score_episode(episode: Any, source: str, kind: str = "", note: str = "", p: Perturbation | None = None) -> Row:
    """Our strict flag and the official verdict for one finished rollout episode (``p``: the
    perturbation it was scripted from, for the API class and the fate of an added call)."""
    ours = bfcl_multi_turn(episode.task, episode.trajectory())
    verdict = official_verdict(episode.task, episode.messages, episode.flags)
    added = "" if p is None or p.added is None else _fate(episode.messages, *p.added)
    return Row(
        episode.task.id,
        episode.task.category,
        source,
        kind,
        note,
        ours.success,
        verdict["valid"],
        list(ours.details.get("turns", [])),
        verdict.get("error_type"),
        verdict.get("error_message"),
        len(episode.calls),
        "" if p is None else p.api_class,
        list(ours.details.get("failures", [])),
        added,
    )


def _fate(messages: list[Message], turn: int, index: int) -> str:
    """ "refused" when the ``index``-th call of user turn ``turn``'s act step got an error response."""
    turns = [n for n, m in enumerate(messages) if m.role == "user"]
    after = messages[turns[turn] + 1 :]
    act = next(n for n, m in enumerate(after) if m.role == "assistant" and m.tool_calls)
    result = [m for m in after[act + 1 :] if m.role == "tool"][index]
    try:
        body = json.loads(result.content)
    except json.JSONDecodeError:
        return "applied"
    return "refused" if isinstance(body, dict) and "error" in body else "applied"


#: per kind: episodes, agreements, ours pass, official pass, ours only (a false positive: ours pass,
#: official fail), official only (ours fail, official pass)
COUNTS = ("n", "agree", "ours", "official", "ours_only", "official_only")


def _counts(rows: list[Row], key: Any) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        k = out.setdefault(key(r), dict.fromkeys(COUNTS, 0))
        values = (1, r.agree, r.ours, r.official, r.ours and not r.official, r.official and not r.ours)
        for name, value in zip(COUNTS, values, strict=True):
            k[name] += int(value)
    return out


def confusion(rows: list[Row]) -> dict[str, Any]:
    """The 2x2 table (ours x official), agreement, Cohen's kappa, and the counts per kind and, for the
    :data:`PER_CLASS` kinds, per API class and per fate of the added call (applied or refused by the API).

    >>> r = lambda o, f: Row("t", "c", "s", "k", "", o, f, [])
    >>> c = confusion([r(True, True), r(False, False), r(False, False), r(True, False)])
    >>> c["matrix"]["ours_pass"], c["matrix"]["ours_fail"], c["agreement"], round(c["kappa"], 3)
    ({'official_pass': 1, 'official_fail': 1}, {'official_pass': 0, 'official_fail': 2}, 0.75, 0.5)
    >>> c["by_kind"]["s/k"]["ours_only"], c["by_kind"]["s/k"]["official_only"]
    (1, 0)
    """
    n = len(rows)
    cell = {(o, f): sum(r.ours == o and r.official == f for r in rows) for o in (True, False) for f in (True, False)}
    matrix = {
        f"ours_{'pass' if o else 'fail'}": {"official_pass": cell[o, True], "official_fail": cell[o, False]}
        for o in (True, False)
    }
    agree = (cell[True, True] + cell[False, False]) / n if n else 0.0
    p_ours, p_off = sum(r.ours for r in rows) / max(n, 1), sum(r.official for r in rows) / max(n, 1)
    chance = p_ours * p_off + (1 - p_ours) * (1 - p_off)
    kappa = (agree - chance) / (1 - chance) if chance < 1 else 1.0
    by_kind = _counts(rows, lambda r: f"{r.source}/{r.kind}" if r.kind else r.source)
    by_class = _counts([r for r in rows if r.api_class], lambda r: r.api_class)
    by_fate = _counts([r for r in rows if r.added], lambda r: r.added)
    return {"n": n, "matrix": matrix, "agreement": agree, "kappa": kappa, "by_kind": by_kind, "by_class": by_class,
            "by_fate": by_fate}  # fmt: skip


def write_classes() -> list[str]:
    """The API classes with a tool that changes compared state (the :data:`PER_CLASS` strata)."""
    return sorted(c for c, tools in EFFECTS.items() if any(public(a) for _, w in tools.values() for a in w))


def select(
    tasks: list[Task], kinds: tuple[str, ...], per_category: int, seed: int = 0
) -> list[tuple[Task, Perturbation]]:
    """``per_category`` episodes of each kind in each category (of each :data:`PER_CLASS` kind, that
    many per API class of :func:`write_classes`), each on a different task within its kind.

    Tasks are drawn in a seeded order per (category, kind, class), skipping those whose gold breaks
    its own tool schemas (the rollout would reject the unperturbed gold) and those a kind does not
    apply to. One task may serve several kinds (:func:`run_scripted` rolls them out in rounds).
    """
    by_category: dict[str, list[Task]] = {}
    for task in tasks:
        if all(_valid(task, t, c) for t, calls in enumerate(task.gold) for c in calls):
            by_category.setdefault(task.category, []).append(task)
    items = []
    for category in sorted(by_category):
        for kind in kinds:
            for api_class in write_classes() if kind in PER_CLASS else [""]:
                pool = list(by_category[category])
                random.Random(f"{seed}:{category}:{kind}:{api_class}").shuffle(pool)
                taken = 0
                while pool and taken < per_category:
                    task = pool.pop()
                    found = perturb(task, kind, random.Random(f"{seed}:{task.id}:{kind}:{api_class}"), api_class)
                    if found is not None:
                        items.append((task, found))
                        taken += 1
    return items


def _rounds(items: list[tuple[Task, Perturbation]]) -> list[list[int]]:
    """The items split into rounds in which no task appears twice (a scripted engine keys by task id)."""
    rounds: list[tuple[list[int], set[str]]] = []
    for n, (task, _) in enumerate(items):
        free = next((r for r in rounds if task.id not in r[1]), None)
        if free is None:
            free = ([], set())
            rounds.append(free)
        free[0].append(n)
        free[1].add(task.id)
    return [r for r, _ in rounds]


def run_scripted(items: list[tuple[Task, Perturbation]], tokenizer: Any, fmt: Any) -> list[Row]:
    """Roll each scripted episode out against its real environment and score it both ways; rows in
    the order of ``items``."""
    from envace.rollout import RealEnvironment, RolloutLimits, make_rollout, stop_ids

    limits = RolloutLimits(max_calls_per_step=64, max_new_tokens=8192, max_episode_tokens=10**7)  # never cut a script
    rows: dict[int, Row] = {}
    for batch in _rounds(items):
        chosen = [items[n] for n in batch]
        engine = ScriptEngine(tokenizer, stop_ids(tokenizer, fmt), scripts={t.id: p.script for t, p in chosen})
        episodes = make_rollout(engine, tokenizer, fmt, RealEnvironment(), limits).run([t for t, _ in chosen])
        for n, ep, (_, p) in zip(batch, episodes, chosen, strict=True):
            rows[n] = score_episode(ep, "scripted", p.kind, p.note, p)
    return [rows[n] for n in range(len(items))]
