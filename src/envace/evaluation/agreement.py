"""Agreement of the env-free BFCL multi-turn reward with bfcl-eval's official ``multi_turn_checker``.

The reward (:func:`envace.rewards.bfcl.bfcl_multi_turn`) compares calls with the gold; the official
checker executes both and compares the API instances' states and the execution results after each
turn. This study harness builds episodes whose calls are the gold with one :func:`perturb`-ation,
written by :class:`ScriptEngine` into the ordinary rollout loop (so a real environment executes
them), scores each episode both ways (:func:`score_episode`: the reward, and the evaluation's own
:func:`~envace.evaluation.bfcl.official_verdict`) and counts the 2x2 table (:func:`confusion`). It
rolls episodes out, so it lives with the evaluation, not with the rewards (which run nothing).
``scripts/reward_agreement.py`` runs the measurement; ``docs/rewards.md`` explains the disagreements.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

from envace.data.sources.bfcl import call_string
from envace.evaluation.bfcl import official_verdict
from envace.protocol import tool_name
from envace.protocol.parse import validate_call
from envace.rewards.bfcl import bfcl_multi_turn, calls_equivalent
from envace.rollout.engine import Request, Sample
from envace.rollout.reference import ScriptedEngine, calls_once_per_turn
from envace.types import Task, ToolCall, ToolSchema

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
)
#: probes of known differences (docs/rewards.md), not in the default mix: a read-only call in an empty gold
#: turn; an ``integer`` argument written as a float (a type error to bfcl-eval's ast_checker and to our reward)
PROBES = ("call_in_empty_turn", "float_for_integer")
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
    """The calls to write per user turn, and what was changed."""

    kind: str
    script: Script
    note: str


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


def _turn_edits(task: Task, kind: str, t: int, i: int, rng: random.Random) -> list[tuple[list[ToolCall], str]]:
    """Candidate new versions of gold turn ``t`` that change its call ``i`` by ``kind``."""
    turn, call = task.gold[t], task.gold[t][i]
    before, after = turn[:i], turn[i + 1 :]
    if kind == "drop_call":
        return [([*before, *after], "dropped")]
    if kind == "duplicate_call":
        return [([*before, call, call, *after], "duplicated")]
    if kind == "swap_calls":
        ok = i + 1 < len(turn) and turn[i] != turn[i + 1]
        return [([*before, turn[i + 1], call, *turn[i + 2 :]], f"swapped with {turn[i + 1].name}")] if ok else []
    if kind == "drop_arg":
        return [
            ([*before, ToolCall(call.name, _without(call.arguments, k)), *after], f"dropped {k}")
            for k in call.arguments
        ]
    props = _props(_visible(task, t).get(call.name))
    if kind == "change_arg":
        news = [
            ToolCall(call.name, {**call.arguments, k: _changed(v, props.get(k) or {}, rng)})
            for k, v in call.arguments.items()
        ]
        return [
            ([*before, new, *after], f"{k}={call.arguments[k]!r}->{new.arguments[k]!r}")
            for new, k in zip(news, call.arguments, strict=True)
            if new.arguments[k] is not None and _valid(task, t, new)
        ]
    if kind == "replace_tool":
        return [([*before, new, *after], f"-> {call_string(new)}") for new in _replacements(task, t, call)]
    if kind == "equivalent_value":
        return [([*before, new, *after], note) for new, note in _equivalents(task, t, call, props)]
    if kind == "float_for_integer":
        ints = [
            k for k, v in call.arguments.items() if type(v) is int and (props.get(k) or {}).get("type") == "integer"
        ]
        return [
            ([*before, ToolCall(call.name, {**call.arguments, k: float(call.arguments[k])}), *after],
             f"{k}={call.arguments[k]!r}->{float(call.arguments[k])!r}")
            for k in ints
        ]  # fmt: skip
    return []


def _without(arguments: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if k != key}


def _edits(task: Task, kind: str, rng: random.Random) -> list[tuple[Script, str]]:
    """Every candidate edit of ``kind`` of the task's gold, with a note naming it."""
    gold = task.gold
    if kind in ("extra_readonly", "call_in_empty_turn"):
        out = []
        for t in [t for t, c in enumerate(gold) if bool(c) == (kind == "extra_readonly")]:
            for name in _read_only(task, t):
                pos = rng.randint(0, len(gold[t]))
                calls = [*gold[t][:pos], ToolCall(name), *gold[t][pos:]]
                out.append((_with_turn(gold, t, calls), f"turn {t}: {name}() inserted at {pos}"))
        return out
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


def perturb(task: Task, kind: str, rng: random.Random) -> Perturbation | None:
    """The task's gold with one change of ``kind`` (one of :data:`KINDS` or :data:`PROBES`),
    picked with ``rng``; ``None`` when the kind does not apply to this task's gold.

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
    edits = _edits(task, kind, rng)
    if not edits:
        return None
    script, note = rng.choice(edits)
    return Perturbation(kind, copy.deepcopy(script), note)


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

    @property
    def agree(self) -> bool:
        return self.ours == self.official


def score_episode(episode: Any, source: str, kind: str = "", note: str = "") -> Row:
    """Our strict flag and the official verdict for one finished rollout episode."""
    ours = bfcl_multi_turn(episode.task, episode.trajectory())
    verdict = official_verdict(episode.task, episode.messages, episode.flags)
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
    )


COUNTS = ("n", "agree", "ours", "official")


def confusion(rows: list[Row]) -> dict[str, Any]:
    """The 2x2 table (ours x official), agreement, Cohen's kappa, and agreement per kind.

    >>> r = lambda o, f: Row("t", "c", "s", "k", "", o, f, [])
    >>> c = confusion([r(True, True), r(False, False), r(False, False), r(True, False)])
    >>> c["matrix"]["ours_pass"], c["matrix"]["ours_fail"], c["agreement"], round(c["kappa"], 3)
    ({'official_pass': 1, 'official_fail': 1}, {'official_pass': 0, 'official_fail': 2}, 0.75, 0.5)
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
    by_kind: dict[str, dict[str, int]] = {}
    for r in rows:
        k = by_kind.setdefault(f"{r.source}/{r.kind}" if r.kind else r.source, dict.fromkeys(COUNTS, 0))
        for name, value in zip(COUNTS, (1, r.agree, r.ours, r.official), strict=True):
            k[name] += int(value)
    return {"n": n, "matrix": matrix, "agreement": agree, "kappa": kappa, "by_kind": by_kind}


def select(
    tasks: list[Task], kinds: tuple[str, ...], per_category: int, seed: int = 0
) -> list[tuple[Task, Perturbation]]:
    """``per_category`` episodes of each kind in each category, each on a different task.

    Tasks are drawn in a seeded order, skipping those whose gold breaks its own tool schemas (the
    rollout would reject the unperturbed gold) and those a kind does not apply to.
    """
    rng = random.Random(seed)
    by_category: dict[str, list[Task]] = {}
    for task in tasks:
        if all(_valid(task, t, c) for t, calls in enumerate(task.gold) for c in calls):
            by_category.setdefault(task.category, []).append(task)
    items = []
    for category in sorted(by_category):
        pool = list(by_category[category])
        rng.shuffle(pool)
        for kind in kinds:
            taken = 0
            while pool and taken < per_category:
                task = pool.pop()
                found = perturb(task, kind, random.Random(f"{seed}:{task.id}:{kind}"))
                if found is not None:
                    items.append((task, found))
                    taken += 1
    return items


def run_scripted(items: list[tuple[Task, Perturbation]], tokenizer: Any, fmt: Any) -> list[Row]:
    """Roll each scripted episode out against its real environment and score it both ways."""
    from envace.rollout import RealEnvironment, RolloutLimits, make_rollout, stop_ids

    if len({t.id for t, _ in items}) != len(items):
        raise ValueError("each task may appear once in a scripted run")
    engine = ScriptEngine(tokenizer, stop_ids(tokenizer, fmt), scripts={t.id: p.script for t, p in items})
    limits = RolloutLimits(max_calls_per_step=64, max_new_tokens=8192, max_episode_tokens=10**7)  # never cut a script
    episodes = make_rollout(engine, tokenizer, fmt, RealEnvironment(), limits).run([t for t, _ in items])
    return [score_episode(ep, "scripted", p.kind, p.note) for ep, (_, p) in zip(episodes, items, strict=True)]
