"""BFCL rewards on hand-made tasks and on real BFCL items from bfcl-eval's wheel."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from envace.rewards import REWARDS, compute_reward, get_reward, reward_for, reward_name
from envace.rewards.bfcl import bfcl_single_turn, calls_equivalent, calls_per_turn
from envace.rewards.bfcl_turns import bfcl_multi_turn
from envace.types import Message, Task, ToolCall, Trajectory

# --------------------------------------------------------------------------- helpers


def traj_of(task: Task, turns: list[list[ToolCall]]) -> Trajectory:
    """One user message per task user turn, then one assistant message with that turn's calls."""
    messages: list[Message] = []
    for text, calls in zip(task.user_turns, turns, strict=False):
        messages += [Message("user", text), Message("assistant", tool_calls=list(calls))]
    return Trajectory(task, messages)


def _option(options: list[Any]) -> Any:
    """The first option that is not ``""`` (BFCL's "may be omitted" marker), else ``_OMIT``."""
    return next((first_choice(x) for x in options if x != ""), _OMIT)


_OMIT = object()


def first_choice(possible: Any) -> Any:
    """A concrete value from a BFCL possible-answer entry: the first usable option, recursively."""
    if isinstance(possible, dict):
        picked = {k: _option(v) for k, v in possible.items()}
        return {k: v for k, v in picked.items() if v is not _OMIT}
    if isinstance(possible, list):
        return [first_choice(v) for v in possible]
    return possible


def gold_output(answer: list[dict[str, Any]]) -> list[ToolCall]:
    return [ToolCall(name, first_choice(params)) for fn in answer for name, params in fn.items()]


# Records where the first non-empty option of some argument is not a valid output, so only a
# cleverer pick would pass: an empty option list for a required argument (live_simple_106/112);
# an option for a key that is not a parameter of that function, where only omitting it passes
# (parallel_multiple_26: "type" belongs to the "transactions" items; parallel_multiple_12:
# "permeability" belongs to the other function).
DATA_QUIRKS = {"live_simple_106-63-0", "live_simple_112-68-0", "parallel_multiple_12", "parallel_multiple_26"}


@cache
def single_turn(category: str) -> dict[str, Task]:
    from envace.data.sources.bfcl_single import load_single_turn

    return {t.id: t for t in load_single_turn(categories=[category])}


@cache
def multi_turn() -> dict[str, Task]:
    from envace.data.sources.bfcl import load_multi_turn

    return {t.id: t for t in load_multi_turn()}


def perturbations(call: ToolCall) -> list[tuple[str, ToolCall]]:
    """Single-argument changes of a call: each value changed, each argument dropped, one added."""
    out = [
        ("name", ToolCall(call.name + "_x", call.arguments)),
        ("extra arg", ToolCall(call.name, {**call.arguments, "zz_extra": 1})),
    ]
    for key, value in call.arguments.items():
        if isinstance(value, bool):
            changed: Any = not value
        elif isinstance(value, int | float):
            changed = value + 1
        elif isinstance(value, str):
            changed = value + "_x"
        elif isinstance(value, list):
            changed = [*value, value[0]] if value else ["x"]
        else:
            changed = {**value, "zz": 1} if isinstance(value, dict) else "x"
        out.append((f"{key} changed", ToolCall(call.name, {**call.arguments, key: changed})))
        out.append((f"{key} dropped", ToolCall(call.name, {k: v for k, v in call.arguments.items() if k != key})))
    return out


# --------------------------------------------------------------------------- single turn


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple"])
def test_single_turn_gold_scores_one_on_real_items(category: str) -> None:
    tasks = single_turn(category)
    failed = {
        t.id
        for t in tasks.values()
        if not bfcl_single_turn(t, traj_of(t, [gold_output(t.extra["possible_answer"])])).success
    }
    assert failed == {i for i in DATA_QUIRKS if i in tasks}


def test_single_turn_hand_example_and_perturbations() -> None:
    task = single_turn("simple_python")["simple_python_0"]
    # ground truth: calculate_triangle_area(base=10, height=5, unit in {"units", omitted})
    gold = ToolCall("calculate_triangle_area", {"base": 10, "height": 5})
    assert bfcl_single_turn(task, traj_of(task, [[gold]])).score == 1.0
    assert bfcl_single_turn(task, traj_of(task, [[ToolCall(gold.name, {**gold.arguments, "unit": "units"})]])).success
    assert bfcl_single_turn(task, traj_of(task, [[]])).score == 0.0  # empty output, gold non-empty
    assert bfcl_single_turn(task, traj_of(task, [[gold, gold]])).score == 0.0  # wrong count
    for what, bad in perturbations(gold):
        assert bfcl_single_turn(task, traj_of(task, [[bad]])).score == 0.0, what
    for what, bad in [("unit", {"unit": "meters"}), ("type", {"base": "10"})]:
        r = bfcl_single_turn(task, traj_of(task, [[ToolCall(gold.name, {**gold.arguments, **bad})]]))
        assert r.score == 0.0 and r.details["error"], what


def test_single_turn_parallel_ignores_order_and_perturbations_fail() -> None:
    task = single_turn("parallel")["parallel_0"]
    gold = gold_output(task.extra["possible_answer"])
    assert len(gold) >= 2
    assert bfcl_single_turn(task, traj_of(task, [gold[::-1]])).success
    for i, call in enumerate(gold):
        for what, bad in perturbations(call):
            calls = [*gold[:i], bad, *gold[i + 1 :]]
            r = bfcl_single_turn(task, traj_of(task, [calls]))
            # dropping an argument that is optional in the answer keeps the call valid
            optional = what.endswith("dropped") and "" in task.extra["possible_answer"][i][call.name][what.split()[0]]
            assert r.score == (1.0 if optional else 0.0), (i, what)


def test_single_turn_irrelevance_and_relevance() -> None:
    task = next(iter(single_turn("irrelevance").values()))
    fn = task.tools[0]["name"]
    assert bfcl_single_turn(task, traj_of(task, [[]])).score == 1.0
    assert bfcl_single_turn(task, traj_of(task, [[ToolCall(fn, {})]])).score == 0.0
    rel = next(iter(single_turn("live_relevance").values()))
    assert bfcl_single_turn(rel, traj_of(rel, [[]])).score == 0.0
    assert bfcl_single_turn(rel, traj_of(rel, [[ToolCall(rel.tools[0]["name"], {})]])).score == 1.0


def test_single_turn_java_uses_original_docs() -> None:
    # the source's hinted Java docs say "string" for every type; the checker needs the originals
    task = single_turn("simple_java")["simple_java_0"]
    gold = ToolCall("GeometryPresentation.createPresentation", {"controller": "mapController", "parent": "mapArea"})
    assert all(p["type"] == "string" for p in task.tools[0]["parameters"]["properties"].values())
    assert bfcl_single_turn(task, traj_of(task, [[gold]])).score == 1.0
    bad = ToolCall(gold.name, {"controller": "mapController", "parent": "otherArea"})
    assert bfcl_single_turn(task, traj_of(task, [[bad]])).score == 0.0


def test_single_turn_underscored_name_and_odd_values() -> None:
    task = Task(
        id="h",
        benchmark="bfcl",
        category="simple_python",
        tools=[
            {
                "name": "math.factorial",
                "parameters": {"type": "dict", "properties": {"number": {"type": "integer"}}, "required": ["number"]},
            }
        ],
        user_turns=["5!"],
        extra={"possible_answer": [{"math.factorial": {"number": [5]}}]},
    )
    assert bfcl_single_turn(task, traj_of(task, [[ToolCall("math_factorial", {"number": 5})]])).success
    assert not bfcl_single_turn(task, traj_of(task, [[ToolCall("math.factorial", {"number": [5]})]])).success
    no_answer = Task(id="n", benchmark="bfcl", category="simple_python", user_turns=["x"])
    assert bfcl_single_turn(no_answer, traj_of(no_answer, [[]])).masked


# --------------------------------------------------------------------------- multi turn

LS = {"name": "ls", "parameters": {"type": "dict", "properties": {"a": {"type": "boolean", "default": False}}}}
CD = {
    "name": "cd",
    "parameters": {"type": "dict", "properties": {"folder": {"type": "string"}}, "required": ["folder"]},
}
FIND = {
    "name": "find",
    "parameters": {
        "type": "dict",
        "properties": {"path": {"type": "string", "default": "."}, "name": {"type": "string", "default": "None"}},
    },
}


NUM = {
    "name": "f",
    "parameters": {
        "properties": {
            "x": {"type": "float"},
            "i": {"type": "integer"},
            "ids": {"type": "array", "items": {"type": "integer"}},
        }
    },
}


def hand_task() -> Task:
    return Task(
        id="mt",
        benchmark="bfcl",
        category="multi_turn_base",
        tools=[LS, CD, FIND],
        user_turns=["go to docs", "nothing to do", "list all"],
        gold=[[ToolCall("cd", {"folder": "docs"}), ToolCall("ls", {})], [], [ToolCall("ls", {"a": True})]],
        env={"involved_classes": ["GorillaFileSystem"]},
    )


def test_multi_turn_hand_example() -> None:
    task = hand_task()
    gold = [list(t) for t in task.gold]
    r = bfcl_multi_turn(task, traj_of(task, gold))
    assert (r.score, r.success, r.details["turns"]) == (1.0, True, [True, True, True])
    # extra reads around the gold calls are allowed, a changed order is not
    extra = [
        [ToolCall("ls", {}), ToolCall("cd", {"folder": "docs"}), ToolCall("find", {}), ToolCall("ls", {})],
        [],
        gold[2],
    ]
    assert bfcl_multi_turn(task, traj_of(task, extra)).score == 1.0
    swapped = [gold[0][::-1], [], gold[2]]
    assert bfcl_multi_turn(task, traj_of(task, swapped)).details["turns"] == [False, True, True]
    # a turn whose gold is empty is not judged, as in the official checker: its calls run before the
    # next turn's and count as that turn's first calls (a read passes, a write there fails turn 2)
    busy = [gold[0], [ToolCall("ls", {})], gold[2]]
    assert bfcl_multi_turn(task, traj_of(task, busy)).details["turns"] == [True, True, True]
    moved = [gold[0], gold[2], []]  # turn 2's only call made a turn early: turn 2 itself makes no call
    assert bfcl_multi_turn(task, traj_of(task, moved)).details["failures"] == ["turn 2: no call"]
    written = [gold[0], [ToolCall("mkdir", {"dir_name": "x"})], gold[2]]
    assert bfcl_multi_turn(task, traj_of(task, written)).details["turns"] == [True, True, False]
    # empty episode: only the empty gold turn passes -> 1/3; no user messages at all -> 0
    assert bfcl_multi_turn(task, traj_of(task, [[], [], []])).score == pytest.approx(1 / 3)
    assert bfcl_multi_turn(task, Trajectory(task, [])).score == 0.0
    # an episode that stopped after turn 0: unreached turns fail
    assert bfcl_multi_turn(task, traj_of(task, gold[:1])).details["turns"] == [True, False, False]
    # a tool of no known API class may do anything: as an extra call it fails the turn
    alien = Task(**{**vars(task), "env": None})
    assert not bfcl_multi_turn(alien, traj_of(alien, extra)).details["turns"][0]
    assert bfcl_multi_turn(alien, traj_of(alien, gold)).success


def test_argument_equivalence_rules() -> None:
    # numbers compare numerically, tuples equal lists, booleans are not numbers
    assert calls_equivalent(ToolCall("f", {"x": 1, "y": (1, 2)}), ToolCall("f", {"x": 1.0, "y": [1, 2]}))
    assert not calls_equivalent(ToolCall("f", {"x": 1}), ToolCall("f", {"x": True}))
    assert not calls_equivalent(ToolCall("f", {"x": "1"}), ToolCall("f", {"x": 1}))
    # an omitted argument equals its schema default, on either side; "None" defaults equal null
    assert calls_equivalent(ToolCall("ls", {}), ToolCall("ls", {"a": False}), LS)
    assert calls_equivalent(ToolCall("ls", {"a": False}), ToolCall("ls", {}), LS)
    assert not calls_equivalent(ToolCall("ls", {}), ToolCall("ls", {"a": True}), LS)
    assert calls_equivalent(ToolCall("find", {"path": "."}), ToolCall("find", {"name": None}), FIND)
    # without a schema default a missing argument fails
    assert not calls_equivalent(ToolCall("cd", {"folder": "a"}), ToolCall("cd", {}), CD)
    assert not calls_equivalent(ToolCall("cd", {}), ToolCall("cd", {"x": None}), CD)
    # bfcl-eval's types: an int is a float, a float is not an integer (also inside arrays)
    assert calls_equivalent(ToolCall("f", {"x": 2.0}), ToolCall("f", {"x": 2}), NUM)
    assert calls_equivalent(ToolCall("f", {"i": 4, "ids": [1]}), ToolCall("f", {"i": 4, "ids": [1]}), NUM)
    assert not calls_equivalent(ToolCall("f", {"i": 4}), ToolCall("f", {"i": 4.0}), NUM)
    assert not calls_equivalent(ToolCall("f", {"ids": [1, 2]}), ToolCall("f", {"ids": [1, 2.0]}), NUM)


def test_turns_split_on_user_messages() -> None:
    ms = [
        Message("assistant", tool_calls=[ToolCall("a")]),
        Message("user", "u1"),
        Message("assistant", tool_calls=[ToolCall("b")]),
        Message("tool", "{}", name="b"),
        Message("assistant", tool_calls=[ToolCall("c")]),
        Message("user", "u2"),
        Message("assistant", "done"),
    ]
    assert [[c.name for c in t] for t in calls_per_turn(ms)] == [["a", "b", "c"], []]


def test_multi_turn_gold_scores_one_on_all_real_tasks() -> None:
    tasks = multi_turn()
    assert len(tasks) == 800
    for task in tasks.values():
        r = bfcl_multi_turn(task, traj_of(task, task.gold))
        assert r.success and r.score == 1.0, task.id
        # an empty episode scores the fraction of empty gold turns, below 1 on every task
        empty = bfcl_multi_turn(task, traj_of(task, [[] for _ in task.gold]))
        assert empty.score == pytest.approx(sum(not g for g in task.gold) / len(task.gold)) and empty.score < 1


@pytest.mark.parametrize(
    "task_id",
    [
        "multi_turn_base_0",
        "multi_turn_base_1",
        "multi_turn_miss_param_3",
        "multi_turn_miss_func_5",
        "multi_turn_long_context_10",
    ],
)
def test_multi_turn_single_argument_perturbations_lower_the_reward(task_id: str) -> None:
    task = multi_turn()[task_id]
    n = len(task.gold)
    checked = 0
    for t, turn in enumerate(task.gold):
        schemas = {s["name"]: s for s in task.tools_at(t)}
        for i, call in enumerate(turn):
            defaults = schemas[call.name]["parameters"]["properties"]
            for what, bad in perturbations(call):
                key = what.split()[0]
                if what.endswith("dropped") and "default" in defaults.get(key, {}):
                    continue  # dropping an argument equal to its default is the same call
                episode = [list(g) for g in task.gold]
                episode[t] = [*turn[:i], bad, *turn[i + 1 :]]
                r = bfcl_multi_turn(task, traj_of(task, episode))
                assert r.score == pytest.approx(1 - 1 / n), (t, i, what)
                assert r.details["turns"][t] is False
                checked += 1
    assert checked > 5


def _with_turn(task: Task, t: int, calls: list[ToolCall]) -> list[list[ToolCall]]:
    return [list(calls) if i == t else list(g) for i, g in enumerate(task.gold)]


def test_order_is_kept_only_where_it_can_matter() -> None:
    # TradingBot, turn 1: get_stock_info then place_order (an order does not move a price)
    task = multi_turn()["multi_turn_miss_param_124"]
    a, b = task.gold[1][:2]
    assert (a.name, b.name) == ("get_stock_info", "place_order")
    assert bfcl_multi_turn(task, traj_of(task, _with_turn(task, 1, [b, a, *task.gold[1][2:]]))).success
    # GorillaFileSystem: cd then touch (the file lands elsewhere when swapped)
    task = multi_turn()["multi_turn_miss_func_2"]
    cd, touch = task.gold[0][:2]
    assert (cd.name, touch.name) == ("cd", "touch")
    swapped = _with_turn(task, 0, [touch, cd, *task.gold[0][2:]])
    assert bfcl_multi_turn(task, traj_of(task, swapped)).details["turns"][0] is False


def test_repeated_side_effects_fail_unless_the_gold_repeats_them() -> None:
    # turn 2 of miss_func_109: one place_order; sent twice, it books two orders
    task = multi_turn()["multi_turn_miss_func_109"]
    order = task.gold[2][0]
    assert order.name == "place_order"
    twice = _with_turn(task, 2, [order, *task.gold[2]])
    assert bfcl_multi_turn(task, traj_of(task, twice)).details["turns"][2] is False
    # with a read in between, or a transfer (no "retry" exception: the first order went through)
    quote = ToolCall("get_stock_info", {"symbol": order.arguments["symbol"]})
    assert not bfcl_multi_turn(task, traj_of(task, _with_turn(task, 2, [order, quote, *task.gold[2]]))).success
    fund = ToolCall("fund_account", {"amount": 10.0})
    assert not bfcl_multi_turn(task, traj_of(task, _with_turn(task, 2, [order, fund, *task.gold[2]]))).success
    # an idempotent call repeated is harmless: lockDoors twice (multi_turn_base_84, turn 0)
    task = multi_turn()["multi_turn_base_84"]
    lock = next(c for c in task.gold[0] if c.name == "lockDoors")
    assert bfcl_multi_turn(task, traj_of(task, _with_turn(task, 0, [lock, *task.gold[0]]))).success


def _failure(task: Task, t: int, calls: list[ToolCall]) -> str:
    """Why turn ``t`` fails when it makes ``calls`` (the gold elsewhere), "" when it passes."""
    r = bfcl_multi_turn(task, traj_of(task, _with_turn(task, t, calls)))
    assert r.details["turns"][:t] + r.details["turns"][t + 1 :] == [True] * (len(task.gold) - 1)
    return next((f for f in r.details["failures"] if f.startswith(f"turn {t}:")), "")


@pytest.mark.parametrize(
    ("task_id", "tool", "change"),
    [  # the issue's three false positives: the gold, then the same tool with another argument
        ("multi_turn_base_51", "lockDoors", {"unlock": True}),  # gold unlock=False
        ("multi_turn_base_70", "fillFuelTank", {"fuelAmount": 11.5}),  # gold 10
        ("multi_turn_base_50", "setHeadlights", {"mode": "off"}),  # gold "on"
    ],
)
def test_an_extra_write_with_other_arguments_fails_the_turn(task_id: str, tool: str, change: dict[str, Any]) -> None:
    task = multi_turn()[task_id]
    t, gold = next((t, c) for t, turn in enumerate(task.gold) for c in turn if c.name == tool)
    extra = ToolCall(tool, {**gold.arguments, **change})
    assert "extra call that changes the state" in _failure(task, t, [*task.gold[t], extra])
    assert _failure(task, t, list(task.gold[t])) == ""
    # right before the gold call too, unless the gold call replaces what it wrote (the headlights, the
    # same doors locked); fuel adds up
    at = task.gold[t].index(gold)
    before = _failure(task, t, [*task.gold[t][:at], extra, *task.gold[t][at:]])
    assert (before == "") == (tool != "fillFuelTank"), before


def test_extra_reads_and_idempotent_repeats_still_pass() -> None:
    task = multi_turn()["multi_turn_base_70"]  # VehicleControlAPI: fill, park, lock, brake, start
    turn = list(task.gold[0])
    reads = [ToolCall("check_tire_pressure"), ToolCall("displayCarStatus", {"option": "fuel"})]
    assert _failure(task, 0, [reads[0], *turn[:3], reads[1], *turn[3:], *reads]) == ""
    lock = next(c for c in turn if c.name == "lockDoors")
    assert _failure(task, 0, [*turn, lock]) == ""  # the doors are locked already: nothing changes
    # a repeat is no longer harmless once a call in between wrote what it touches
    unlock = ToolCall("lockDoors", {**lock.arguments, "unlock": True})
    assert _failure(task, 0, [*turn, unlock, lock]) != ""


@pytest.mark.parametrize(("task_id", "turn"), [("multi_turn_base_5", 2), ("multi_turn_base_40", 3)])
def test_a_turn_written_twice_fails_on_its_non_idempotent_write(task_id: str, turn: int) -> None:
    # authenticate_twitter + post_tweet, message_login + send_message: the login in between is no retry
    task = multi_turn()[task_id]
    calls = list(task.gold[turn])
    assert calls[-1].name in ("post_tweet", "send_message")
    assert "changes the state" in _failure(task, turn, calls + calls)
    assert "changes the state" in _failure(task, turn, [*calls, calls[-1]])


def test_a_call_made_in_an_earlier_turn_may_stand_for_a_gold_call() -> None:
    # long_context_127: turn 2 opens with get_stock_info, a read nothing in turn 1 changes
    task = multi_turn()["multi_turn_long_context_127"]
    quote = task.gold[2][0]
    assert quote.name == "get_stock_info"
    script = [list(t) for t in task.gold]
    script[1].append(script[2].pop(0))
    assert bfcl_multi_turn(task, traj_of(task, script)).success
    # base_1: turn 2 is cd(archive), grep(...); the cd at the end of turn 1 leaves the state compared
    # there alone (the current directory is private) and the grep runs where the gold's does
    task = multi_turn()["multi_turn_base_1"]
    script = [list(t) for t in task.gold]
    script[1].append(script[2].pop(0))
    assert bfcl_multi_turn(task, traj_of(task, script)).success
    # ... but not before turn 1's own mv, which would then run in the archive
    script = [list(t) for t in task.gold]
    script[1].insert(1, script[2].pop(0))
    assert bfcl_multi_turn(task, traj_of(task, script)).details["turns"] == [True, False, False, True]
    # a write moved earlier changes the state compared after turn 0: both turns fail
    task = multi_turn()["multi_turn_base_0"]
    script = [list(t) for t in task.gold]
    script[2].append(script[3].pop(1))  # mv(previous_report.pdf, temp)
    assert bfcl_multi_turn(task, traj_of(task, script)).details["turns"] == [True, True, False, False]
    # a turn with gold calls and no call of its own fails, as bfcl-eval's checker has it
    script = [list(t) for t in task.gold]
    script[1] += script[2]
    script[2] = []
    assert bfcl_multi_turn(task, traj_of(task, script)).details["failures"] == ["turn 2: no call"]


def test_file_system_calls_on_other_entries_commute() -> None:
    task = multi_turn()["multi_turn_base_3"]  # turn 1: cd, cd, cp(test_image1.jpg), cp(test_document.txt)
    turn = list(task.gold[1])
    assert [c.name for c in turn] == ["cd", "cd", "cp", "cp"]
    # two copies into one directory: whether it is one is state, and a later ls shows their order
    assert _failure(task, 1, [*turn[:2], turn[3], turn[2]]) != ""
    rm = [ToolCall("rm", {"file_name": n}) for n in ("a.txt", "b.txt")]
    assert _failure(task, 1, [*turn, *rm]) != ""  # extra removals change the state
    gold = [[*g, *rm] if i == 1 else list(g) for i, g in enumerate(task.gold)]
    swapped = Task(**{**vars(task), "gold": gold})
    assert bfcl_multi_turn(swapped, traj_of(swapped, [*gold[:1], [*turn, *rm[::-1]], *gold[2:]])).success
    touch = [ToolCall("touch", {"file_name": n}) for n in ("a.txt", "b.txt")]
    gold = [[*g, *touch] if i == 1 else list(g) for i, g in enumerate(task.gold)]
    created = Task(**{**vars(task), "gold": gold})  # the order of new entries shows in a later ls
    assert not bfcl_multi_turn(created, traj_of(created, [*gold[:1], [*turn, *touch[::-1]], *gold[2:]])).success


# --------------------------------------------------------------------------- registry


def test_registry_and_dispatch() -> None:
    mt, st = hand_task(), single_turn("simple_python")["simple_python_0"]
    assert reward_for(mt) is bfcl_multi_turn and reward_for(st) is bfcl_single_turn
    assert reward_name(Task(id="t", benchmark="tau2")) == "tau2"
    assert reward_name(Task(id="t", benchmark="finmcp")) == "toolf1"
    assert reward_name(Task(id="t", benchmark="vitabench", extra={"reward": "judge"})) == "judge"
    with pytest.raises(ValueError, match="memory"):
        reward_name(Task(id="t", benchmark="bfcl", category="memory_kv"))
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward("nope")
    assert set(REWARDS) >= {"bfcl-single-turn", "bfcl-multi-turn", "tau2", "toolf1", "vitabench", "judge"}
    for name in REWARDS:  # every "module:function" string resolves
        assert callable(get_reward(name)), name
    assert compute_reward(mt, traj_of(mt, mt.gold)).score == 1.0


def test_compute_reward_names_a_failing_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    import envace.rewards
    from envace.rewards import RewardError

    def boom(task: Task, traj: Trajectory) -> Any:
        raise KeyError("gold")

    monkeypatch.setattr(envace.rewards, "get_reward", lambda name: boom)
    task = hand_task()
    with pytest.raises(RewardError, match="reward 'bfcl-multi-turn' raised on task 'mt': KeyError"):
        compute_reward(task, traj_of(task, task.gold))


def test_an_episode_the_step_limit_ended_scores_zero_as_the_official_runner_fails_it() -> None:
    """bfcl-eval's runner force-terminates a turn at its step limit and fails the task, whatever the
    calls so far (bfcl_cpu's proxy paid such episodes: repeated calls until ``max_steps``); other
    limit flags leave the score to the state comparison, as the checker does."""
    task = multi_turn()["multi_turn_base_0"]
    gold = traj_of(task, task.gold)
    assert compute_reward(task, gold).success
    cut = compute_reward(task, gold, ended_by={"max_steps"})
    assert (cut.score, cut.success, cut.details["ended_by"]) == (0.0, False, ["max_steps"])
    assert compute_reward(task, gold, ended_by={"truncated"}).success
