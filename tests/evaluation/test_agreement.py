"""Agreement of the env-free BFCL multi-turn reward with bfcl-eval's official checker, on scripted
gold perturbations rolled out against the real environment (scripts/reward_agreement.py at scale)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from functools import cache

import pytest

from envace._bfcl import bfcl_module
from envace.data.sources.bfcl import load_multi_turn
from envace.envs.bfcl import BFCLEnvironment
from envace.evaluation.agreement import KINDS, READ_ONLY, Perturbation, confusion, perturb, run_scripted, select
from envace.evaluation.bfcl import official_verdict
from envace.protocol.render import HermesFormat
from envace.rewards.bfcl import calls_equivalent, tool_classes
from envace.rewards.bfcl_effects import ordered
from envace.types import Message, Task, ToolCall

FMT = HermesFormat(tool_style="compact")


@cache
def tasks() -> dict[str, Task]:
    return {t.id: t for t in load_multi_turn()}


def spelled(script: list[list[ToolCall]]) -> str:
    """The calls as JSON text: 5 and 5.0 differ here (``ToolCall.__eq__`` says they are equal)."""
    return json.dumps([[c.to_dict() for c in turn] for turn in script])


def test_small_agreement_run(tokenizer) -> None:
    items = select(list(tasks().values()), ("gold", "swap_calls", "extra_readonly"), per_category=1, seed=3)
    assert len(items) == 12 and len({t.category for t, _ in items}) == 4
    rows = run_scripted(items, tokenizer, FMT)
    c = confusion(rows)
    m = c["matrix"]
    assert c["n"] == 12 == sum(v for row in m.values() for v in row.values())
    assert c["agreement"] == sum(r.agree for r in rows) / 12
    # the unperturbed gold passes both ways, on every category
    gold = [r for r in rows if r.kind == "gold"]
    assert len(gold) == 4 and all(r.ours and r.official and r.n_calls > 0 for r in gold)
    assert c["by_kind"]["scripted/gold"] == {"n": 4, "agree": 4, "ours": 4, "official": 4}
    # an extra read-only call: both accept it (subsequence / same state and results)
    assert all(r.ours and r.official for r in rows if r.kind == "extra_readonly")
    # a swap of two calls fails our check only where their order can matter (one class, not commuting)
    for r, (task, _) in zip(rows, items, strict=True):
        if r.kind == "swap_calls":
            names = re.match(r"turn \d+ call \d+ (\w+): swapped with (\w+)", r.note).groups()
            owner = tool_classes(tuple(task.env["involved_classes"]))
            assert r.ours == (owner[names[0]] != owner[names[1]] or not ordered(owner[names[0]], *names)), r


@pytest.mark.parametrize("task_id", ["multi_turn_base_3", "multi_turn_base_5", "multi_turn_base_15"])
def test_each_kind_makes_the_change_it_names(task_id: str) -> None:
    task = tasks()[task_id]
    n_gold = sum(map(len, task.gold))
    for kind in KINDS:
        p = perturb(task, kind, random.Random(kind))
        assert p is not None and p.kind == kind, kind
        flat = [c for turn in p.script for c in turn]
        if kind == "gold":
            assert p.script == task.gold
            continue
        assert spelled(p.script) != spelled(task.gold), kind
        changed = [t for t in range(len(task.gold)) if spelled(p.script[t : t + 1]) != spelled(task.gold[t : t + 1])]
        assert len(changed) == 1, kind  # one perturbation, in one turn
        gold_turn, new_turn = task.gold[changed[0]], p.script[changed[0]]
        if kind in ("drop_call",):
            assert len(flat) == n_gold - 1
        elif kind in ("duplicate_call", "extra_readonly"):
            assert len(flat) == n_gold + 1
        elif kind == "swap_calls":
            assert Counter(map(hash, new_turn)) == Counter(map(hash, gold_turn))
        elif kind == "equivalent_value":  # our reward counts the new call as the same call (4.0 is no integer)
            schemas = {s["name"]: s for s in task.tools_at(changed[0])}
            assert all(calls_equivalent(g, c, schemas[g.name]) for g, c in zip(gold_turn, new_turn, strict=True))
        else:  # change_arg, drop_arg, replace_tool: one call differs
            assert len(new_turn) == len(gold_turn)
            assert sum(g != c for g, c in zip(gold_turn, new_turn, strict=True)) == 1


def test_kinds_that_do_not_apply_give_none() -> None:
    task = Task(id="x", benchmark="bfcl", gold=[[ToolCall("pwd")]], tools=[{"name": "pwd", "parameters": {}}])
    assert perturb(task, "swap_calls", random.Random(0)) is None  # one call: nothing to swap
    assert perturb(task, "change_arg", random.Random(0)) is None  # no argument to change
    with pytest.raises(ValueError, match="unknown perturbation"):
        perturb(task, "shuffle", random.Random(0))


def test_read_only_calls_leave_every_state_unchanged() -> None:
    for class_name, names in READ_ONLY.items():
        task = next(t for t in tasks().values() if class_name in t.env["involved_classes"])
        env = BFCLEnvironment.from_task(task)
        before = env.snapshot()
        for name in names:
            env.execute(ToolCall(name), validate=False)
        assert env.snapshot() == before, class_name


def test_calls_on_different_classes_commute_in_both_scores(tokenizer) -> None:
    # turn 0: get_outside_temperature_from_google (VehicleControlAPI), send_message (MessageAPI)
    task = tasks()["multi_turn_long_context_91"]
    assert {c.name for c in task.gold[0][:2]} == {"get_outside_temperature_from_google", "send_message"}
    script = [list(t) for t in task.gold]
    script[0][:2] = script[0][1::-1]
    same = [list(t) for t in tasks()["multi_turn_base_0"].gold]  # cd, mkdir: one class, order matters
    same[0][:2] = same[0][1::-1]
    rows = run_scripted(
        [(task, Perturbation("swap_calls", script, "")), (tasks()["multi_turn_base_0"], Perturbation("s", same, ""))],
        tokenizer,
        FMT,
    )
    assert (rows[0].ours, rows[0].official) == (True, True)
    assert (rows[1].ours, rows[1].official) == (False, False)


@pytest.mark.parametrize(
    ("task_id", "edit", "ours", "official"),
    [  # documented disagreements (docs/rewards.md): each one pinned
        ("multi_turn_miss_func_25", ("swap", 3, 0, None), False, True),
        ("multi_turn_miss_param_58", ("duplicate", 2, 1, None), False, True),
        ("multi_turn_miss_func_161", ("change", 1, 0, "client_id"), False, True),
        ("multi_turn_miss_param_0", ("empty_turn_call", 3, 0, None), False, True),
        ("multi_turn_miss_func_102", ("float_for_integer", 1, 0, "order_id"), False, True),
        # disagreements of earlier versions of the reward, now agreeing
        ("multi_turn_long_context_156", ("float_for_integer", 3, 1, "priority"), False, False),
        ("multi_turn_miss_func_109", ("duplicate", 2, 0, None), False, False),
        ("multi_turn_miss_param_124", ("swap", 1, 0, None), True, True),
    ],
)
def test_documented_disagreements(tokenizer, task_id, edit, ours, official) -> None:
    task = tasks()[task_id]
    what, t, i, key = edit
    script = [list(turn) for turn in task.gold]
    call = script[t][i] if script[t] else None
    if what == "float_for_integer":
        script[t][i] = ToolCall(call.name, {**call.arguments, key: float(call.arguments[key])})
    elif what == "change":
        script[t][i] = ToolCall(call.name, {**call.arguments, key: call.arguments[key] + "_2"})
    elif what == "duplicate":
        script[t].insert(i, call)
    elif what == "swap":
        script[t][i : i + 2] = script[t][i + 1 : i - 1 if i else None : -1]
    else:
        assert not task.gold[t]  # a turn whose gold is empty (the missing parameter is asked for)
        script[t] = [ToolCall("pwd")]
    (row,) = run_scripted([(task, Perturbation(what, script, ""))], tokenizer, FMT)
    assert (row.ours, row.official) == (ours, official), row


def test_official_verdict_force_terminates_and_cleans_up() -> None:
    task = tasks()["multi_turn_base_0"].first_turns(2)
    assert len(task.gold) == len(task.extra["ground_truth"]) == len(task.user_turns) == 2
    one_turn = [Message("user", "u"), Message("assistant", tool_calls=list(task.gold[0]))]
    v = official_verdict(task, one_turn)
    assert (v["valid"], v["error_type"]) == (False, "multi_turn:force_terminated")
    both = [*one_turn, Message("user", "v"), Message("assistant", tool_calls=list(task.gold[1]))]
    assert official_verdict(task, both)["valid"]
    assert official_verdict(task, both, {"max_steps"})["error_type"] == "multi_turn:force_terminated"
    store = vars(bfcl_module("eval_checker.multi_turn_eval.multi_turn_utils"))
    assert not [k for k in store if k.startswith("envace_agree_")]  # no cached API instances left


def test_equivalent_value_never_writes_a_float_for_an_integer() -> None:
    # multi_turn_base_1's only numbers are integers: 5 -> 5.0 is a type error, not a spelling
    assert perturb(tasks()["multi_turn_base_1"], "equivalent_value", random.Random(0)) is None
    p = perturb(tasks()["multi_turn_base_1"], "float_for_integer", random.Random(0))
    assert p is not None and isinstance(p.note, str) and ".0" in p.note
