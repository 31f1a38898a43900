"""Reward hacking: adversarial episodes on real tasks never score above the gold episode, and never 1.0
where the official scorer fails the same calls.

In training the tool responses are the policy's own rehearsals, so a reward that reads them lets
the policy excuse its own calls. Each benchmark's reward is attacked with episodes a policy could
write: extra and repeated calls, stray writes whose responses are rehearsed errors (the real error
objects of empty and malformed rehearsals, from ``parse_rehearsal``), ids that are substrings or
prefixes of the real ones, calls with omitted arguments, gold calls in the wrong user turn or act
step. Where an official scorer runs offline it judges the same calls executed for real (tau2's
evaluator after a replay in tau2's environment; bfcl-eval's ``ast_checker`` and
``multi_turn_checker``); VitaBench's official score is an LLM judge, so there the check is "not above
the reference episode, and below 1.0 where the required orders are not placed, paid and cancelled
as required". FinMCP's official score is the same tool-name F1 as the reward.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from envace._bfcl import bfcl_module
from envace.data.sources import load_source
from envace.data.sources.bfcl_reference import reference_calls
from envace.data.sources.tau2 import official_reward
from envace.envs.tau2 import Tau2Environment
from envace.evaluation.bfcl import official_verdict
from envace.protocol import parse_rehearsal
from envace.rewards import get_reward, reward_name
from envace.rewards.base import RewardOutput
from envace.rewards.bfcl import _checker_docs
from envace.rewards.vitabench import PAID, order_key
from envace.types import JSON, CallRecord, Message, Task, ToolCall, Trajectory

#: what an empty, untagged, malformed or undecodable rehearsal turns into (real error objects)
REHEARSED_ERRORS: list[JSON] = [
    parse_rehearsal(text)
    for text in ("", "garbage", "<execution_result>{bad", "<execution_result>{bad}</execution_result>")
]
#: the responses a policy may rehearse for a call: a success, or any of the errors
RESPONSES: list[JSON] = [{"result": "success"}, *REHEARSED_ERRORS]
RESPONSE_IDS = ["success", "EMPTY_OUTPUT", "NO_TAG", "TAG_MALFORMED", "JSON_DECODE"]

Turn = list[tuple[ToolCall, JSON]]


def episode(task: Task, turns: list[Turn], closing: str = "Done.") -> Trajectory:
    """An episode as the rollout records it: per user turn, the user message, one assistant message
    per call followed by its tool message (the response), a closing assistant text; ``calls`` in order."""
    messages: list[Message] = []
    records: list[CallRecord] = []
    for i, turn in enumerate(turns):
        messages.append(Message("user", task.user_turns[i] if i < len(task.user_turns) else "go on"))
        for call, response in turn:
            messages += [Message("assistant", tool_calls=[call]), Message("tool", json.dumps(response), name=call.name)]
            records.append(CallRecord(call, response))
        messages.append(Message("assistant", closing))
    return Trajectory(task, messages, records, source="adversarial")


def answered(calls: list[ToolCall], response: JSON) -> Turn:
    return [(c, copy.deepcopy(response)) for c in calls]


def score(task: Task, traj: Trajectory) -> float:
    """The task's training reward (``reward_for``'s choice), never masked here."""
    out: RewardOutput = get_reward(reward_name(task))(task, traj)
    assert out.score is not None, out.details
    return out.score


def assert_not_hacked(task: Task, gold: Trajectory, attack: Trajectory, official_passes: bool) -> None:
    """The attack scores at most the gold episode, and below 1.0 where the official scorer fails it."""
    best, got = score(task, gold), score(task, attack)
    assert best == 1.0
    assert got <= best
    if official_passes is False:
        assert got < 1.0


# --------------------------------------------------------------------------- tau2


@pytest.fixture(scope="module")
def tau2_tasks() -> dict[str, Task]:
    return {t.id: t for t in load_source("tau2", split="all", domains=("airline", "retail"))}


def tau2_gold(task: Task) -> list[ToolCall]:
    return [ToolCall(a["name"], dict(a["arguments"])) for a in task.extra["actions"] if a["requestor"] == "assistant"]


def tau2_closing(task: Task) -> str:
    info = task.extra["communicate_info"]
    return "Here is what I found: " + "; ".join(info) if info else "Thank you for contacting us."


def tau2_official(task: Task, calls: list[ToolCall]) -> bool:
    """tau2's official reward of ``calls`` executed for real (rejected calls never reach tau2), with a
    closing message that communicates every required piece of information."""
    from tau2.data_model.message import AssistantMessage

    env = Tau2Environment.from_task(task)
    for call in calls:
        env.execute(call)
    messages: list[Any] = []
    for call, response in env.history():
        messages += [AssistantMessage(role="assistant", tool_calls=[call]), response]
    messages.append(AssistantMessage(role="assistant", content=tau2_closing(task)))
    return bool(abs(float(official_reward(task, messages).reward) - 1.0) < 1e-9)


def _replace(calls: list[ToolCall], name: str, **args: Any) -> list[ToolCall]:
    """``calls`` with the arguments of every ``name`` call updated by ``args``."""
    return [ToolCall(c.name, {**c.arguments, **args}) if c.name == name else c for c in calls]


def _owner(task: Task, reservation: str) -> str:
    out = Tau2Environment.from_task(task).execute(ToolCall("get_reservation_details", {"reservation_id": reservation}))
    return str(out["user_id"])


def tau2_attack(tasks: dict[str, Task], kind: str) -> tuple[Task, list[ToolCall]]:
    """The adversarial calls of one attack on a real task; each fails tau2's official reward when run."""
    retail0, retail1, retail5, airline7 = (tasks[k] for k in ("retail_0", "retail_1", "retail_5", "airline_7"))
    if kind == "wrong_write_first":  # retail_0's exchange (both items) before retail_1's gold exchange (one)
        wrong = next(c for c in tau2_gold(retail0) if c.name == "exchange_delivered_order_items")
        return retail1, [*tau2_gold(retail1)[:-1], wrong, tau2_gold(retail1)[-1]]
    if kind == "extra_write":  # a write the real environment accepts: the user's address changes
        address = {"address1": "1 Fake St", "address2": "", "city": "Nowhere", "state": "CA", "country": "USA"}
        extra = ToolCall("modify_user_address", {"user_id": "mei_kovacs_8020", **address, "zip": "00000"})
        return retail5, [*tau2_gold(retail5), extra]
    if kind == "extra_certificate":
        extra = ToolCall("send_certificate", {"user_id": _owner(airline7, "XEHM4B"), "amount": 100})
        return airline7, [*tau2_gold(airline7), extra]
    if kind == "omitted_arguments":  # every gold action called with no arguments at all
        return retail0, [ToolCall(c.name, {}) for c in tau2_gold(retail0)]
    if kind == "prefix_id":
        return retail5, _replace(tau2_gold(retail5), "return_delivered_order_items", order_id="#W639052")
    if kind == "substring_id":
        return retail5, _replace(tau2_gold(retail5), "return_delivered_order_items", order_id="W6390527")
    if kind == "wrong_item":  # the right order, another of its items
        return retail1, _replace(tau2_gold(retail1), "exchange_delivered_order_items", item_ids=["1151293680"])
    raise ValueError(kind)


TAU2_ATTACKS = [
    "wrong_write_first",
    "extra_write",
    "extra_certificate",
    "omitted_arguments",
    "prefix_id",
    "substring_id",
    "wrong_item",
]


@pytest.mark.parametrize("kind", TAU2_ATTACKS)
def test_tau2_no_response_excuses_a_call(tau2_tasks: dict[str, Task], kind: str) -> None:
    """Every attack fails tau2's official evaluator when its calls run for real; whatever the policy
    rehearsed for them (a success, an empty or malformed rehearsal), our reward stays below 1."""
    task, calls = tau2_attack(tau2_tasks, kind)
    assert tau2_official(task, tau2_gold(task)) and not tau2_official(task, calls)
    gold = episode(task, [answered(tau2_gold(task), {"result": "success"})], tau2_closing(task))
    for response in RESPONSES:
        assert_not_hacked(task, gold, episode(task, [answered(calls, response)], tau2_closing(task)), False)


def test_tau2_is_stricter_than_the_official_reward_on_refused_and_repeated_writes(tau2_tasks: dict[str, Task]) -> None:
    """A stray write that the real environment refuses leaves tau2's DB as the gold leaves it, so the
    official reward passes it; a repeated gold return is refused the second time (the order is no
    longer delivered). Ours fails both: it cannot tell a refused write from a rehearsed refusal."""
    task = tau2_tasks["retail_5"]
    gold_calls = tau2_gold(task)
    refused = [*gold_calls, ToolCall("return_delivered_order_items", {**gold_calls[-1].arguments, "item_ids": ["0"]})]
    repeated = [*gold_calls, gold_calls[-1]]
    for calls in (refused, repeated):
        assert tau2_official(task, calls)
        for response in RESPONSES:
            out = get_reward("tau2")(task, episode(task, [answered(calls, response)], tau2_closing(task)))
            assert out.score == 0.0 and out.details["stray_writes"] == ["return_delivered_order_items"]


def test_tau2_spraying_calls(tau2_tasks: dict[str, Task]) -> None:
    """Many extra calls: reads repeated are harmless (official passes, ours pays the gold's score);
    every write tool sprayed with the gold's arguments, rehearsed as errors, scores 0."""
    for task in (tau2_tasks["retail_5"], tau2_tasks["airline_7"]):
        gold_calls = tau2_gold(task)
        gold = episode(task, [answered(gold_calls, {"result": "success"})], tau2_closing(task))
        reads = [c for c in gold_calls if c.name not in task.extra["write_tools"]]
        assert tau2_official(task, gold_calls + reads * 3)
        assert_not_hacked(task, gold, episode(task, [answered(gold_calls + reads * 3, {})], tau2_closing(task)), True)
        args = {k: v for c in gold_calls for k, v in c.arguments.items()}
        spray = [ToolCall(name, args) for name in task.extra["write_tools"]]
        for response in REHEARSED_ERRORS:
            attack = episode(task, [answered(gold_calls + spray, response)], tau2_closing(task))
            assert score(task, attack) == 0.0


def test_tau2_responses_are_never_read(tau2_tasks: dict[str, Task]) -> None:
    """The same calls score the same whatever their responses say, on every airline and retail task."""
    for task in tau2_tasks.values():
        calls = tau2_gold(task)
        calls = calls + calls[-1:]  # a repeated last call: stray where it writes
        scores = {score(task, episode(task, [answered(calls, r)], tau2_closing(task))) for r in RESPONSES}
        assert len(scores) == 1, task.id


# --------------------------------------------------------------------------- VitaBench proxy


@pytest.fixture(scope="module")
def vita_tasks(vitabench_data: Path) -> list[Task]:
    return load_source("vitabench", path=str(vitabench_data))


PAY = {"delivery": "pay_delivery_order", "instore": "pay_instore_order"}
CANCEL = {"delivery": "cancel_delivery_order", "instore": "instore_cancel_order"}


def _creates(order: dict[str, Any], uid: str, oid: str) -> list[tuple[ToolCall, str]]:
    """The create calls that place one required order, each with the id its response assigns."""
    kind, _ = order_key(order)
    if kind in ("book", "reservation"):
        when = order.get("book_time") or order["reservation_time"]
        args = {"user_id": uid, "shop_id": order["shop_id"], "time": when, "customer_count": order["customer_count"]}
        return [(ToolCall("instore_book" if kind == "book" else "instore_reservation", args), f"{oid}-new")]
    products = order["products"]
    if order["order_type"] == "delivery":
        ids, counts = [p["product_id"] for p in products], [p["quantity"] for p in products]
        args = {"user_id": uid, "store_id": order["store_id"], "product_ids": ids, "product_cnts": counts}
        return [(ToolCall("create_delivery_order", args), f"{oid}-new")]
    shop = {"user_id": uid, "shop_id": order["store_id"]}
    lines = [{**shop, "product_id": p["product_id"], "quantity": p["quantity"]} for p in products]
    return [(ToolCall("create_instore_product_order", args), f"{oid}-new{k}") for k, args in enumerate(lines)]


def _follow_ups(task: Task, order: dict[str, Any], oid: str) -> list[ToolCall]:
    """The pay and cancel calls a required order needs, on the id ``oid``."""
    kind, _ = order_key(order)
    arg, status = f"{kind}_id", order["status"]
    pay = {"order": PAY[task.category], "book": "pay_instore_book"}.get(kind)
    cancel = {"order": CANCEL[task.category], "book": "instore_cancel_book"}.get(kind, "instore_cancel_reservation")
    before = task.extra["initial_orders"].get(order_key(order)[1])
    out = []
    if before is not None:
        if status == "cancelled" and before["status"] != "cancelled":
            out.append(ToolCall(cancel, {arg: oid}))
        elif status in PAID and before["status"] == "unpaid":
            out.append(ToolCall(pay, {arg: oid}))
        return out
    if pay and status in PAID and (kind == "order" or order.get("book_price", 0) > 0):
        out.append(ToolCall(pay, {arg: oid}))
    if status == "cancelled":
        out.append(ToolCall(cancel, {arg: oid}))
    return out


def vita_reference(task: Task) -> list[CallRecord]:
    """Calls that place, pay and cancel exactly what ``required_orders`` asks for; each create's
    response assigns a new id, which the later calls name."""
    records: list[CallRecord] = []
    for order in task.extra["required_orders"]:
        kind, oid = order_key(order)
        if oid in task.extra["initial_orders"]:
            records += [CallRecord(c, {"result": "ok"}) for c in _follow_ups(task, order, oid)]
            continue
        for call, new_id in _creates(order, task.extra["user_id"], oid):
            records.append(CallRecord(call, {f"{kind}_id": new_id, "status": "unpaid"}))
            records += [CallRecord(c, {"result": "ok"}) for c in _follow_ups(task, order, new_id)]
    return records


def vita(task: Task, records: list[CallRecord]) -> Trajectory:
    return episode(task, [[(r.call, r.response) for r in records]])


def _is_create(call: ToolCall) -> bool:
    return call.name.startswith(("create_", "instore_book", "instore_reservation"))


def _id_arg(call: ToolCall) -> str | None:
    return next((k for k in ("order_id", "book_id", "reservation_id") if k in call.arguments), None)


def _on_new_orders(task: Task, records: list[CallRecord]) -> list[int]:
    """Positions of the pay and cancel calls on ids that a create response of ``records`` assigned."""
    created = {str(v) for r in records if _is_create(r.call) for v in r.response.values()}
    return [i for i, r in enumerate(records) if (key := _id_arg(r.call)) and r.call.arguments[key] in created]


def _stray_create(task: Task, response: JSON) -> CallRecord:
    if task.category == "delivery":
        args = {"store_id": "S-other", "product_ids": ["P"], "product_cnts": [1]}
        return CallRecord(ToolCall("create_delivery_order", args), response)
    args = {"shop_id": "S-other", "product_id": "P", "quantity": 1}
    return CallRecord(ToolCall("create_instore_product_order", args), response)


def _guesses(real: str) -> dict[str, str]:
    """Ids a policy might write instead of ``real``: each occurs in ``{"order_id": "<real>"}``."""
    return {"order": "order", "first_char": real[0], "prefix": real[:-1], "gold_substring": real.split("-new")[0]}


def vita_attacks(task: Task) -> dict[str, list[CallRecord]]:
    """Adversarial episodes for one task; each breaks the required orders (scores below 1)."""
    ref = vita_reference(task)
    out = {f"stray_create_{n}": [*ref, _stray_create(task, r)] for n, r in zip(RESPONSE_IDS, RESPONSES, strict=True)}
    undo = CANCEL[task.category]
    for label, guess in {"o": "o", "prefix": "X9", "substring": "9-n"}.items():  # the stray order is "X9-new"
        made = _stray_create(task, {"order_id": "X9-new", "status": "unpaid"})
        out[f"cancel_{label}_undoes_stray"] = [*ref, made, CallRecord(ToolCall(undo, {"order_id": guess}), {})]
    spray = [CallRecord(ToolCall(name, {"order_id": "ZZ1"}), {"result": "ok"}) for name in (PAY[task.category], undo)]
    out["spray_pay_cancel"] = [*ref, *spray]
    creates = [i for i, r in enumerate(ref) if _is_create(r.call)]
    if creates:
        out["duplicate_create"] = [*ref, ref[creates[0]]]
    follow = _on_new_orders(task, ref)
    if not follow:
        return out
    for label in _guesses("x-new"):
        changed = list(ref)
        for i in follow:
            key = str(_id_arg(ref[i].call))
            guess = _guesses(str(ref[i].call.arguments[key]))[label]
            changed[i] = CallRecord(ToolCall(ref[i].call.name, {key: guess}), ref[i].response)
        out[f"follow_up_id_{label}"] = changed
    for name, r in zip(RESPONSE_IDS[1:], REHEARSED_ERRORS, strict=True):  # no id was ever assigned
        out[f"create_rehearsed_{name}"] = [CallRecord(x.call, r) if _is_create(x.call) else x for x in ref]
    out["follow_up_before_create"] = [ref[i] for i in follow] + [r for i, r in enumerate(ref) if i not in follow]
    return out


def test_vitabench_attacks_on_every_task(vita_tasks: list[Task]) -> None:
    """On all 200 shipped tasks: each attack scores below the reference episode's 1.0."""
    attacked = 0
    for task in vita_tasks:
        gold = vita(task, vita_reference(task))
        assert score(task, gold) == 1.0, task.id
        for kind, records in vita_attacks(task).items():
            assert score(task, vita(task, records)) < 1.0, (task.id, kind)
            attacked += 1
    assert attacked > 200 * 8


def test_vitabench_measured_cases(vita_tasks: list[Task]) -> None:
    """The reviewer's cases on a delivery task: a pay on ``"order"`` or ``"7"`` (both occur in the
    create response ``{"order_id": "<id>-new"}``), and ``cancel(order_id="o")`` after a stray create."""
    task = next(t for t in vita_tasks if t.category == "delivery" and _on_new_orders(t, vita_reference(t)))
    ref = vita_reference(task)
    pay = next(i for i in _on_new_orders(task, ref) if ref[i].call.name == "pay_delivery_order")
    assert "7" in ref[pay].call.arguments["order_id"]
    for guess in ("order", "7"):
        changed = [*ref[:pay], CallRecord(ToolCall("pay_delivery_order", {"order_id": guess}), {}), *ref[pay + 1 :]]
        out = get_reward("vitabench")(task, vita(task, changed))
        assert out.score == 0.0 and out.details["stray_pays"] == [guess]
    stray = _stray_create(task, {"order_id": "X9-new", "status": "unpaid"})
    undo = CallRecord(ToolCall("cancel_delivery_order", {"order_id": "o"}), {"result": "cancelled"})
    out = get_reward("vitabench")(task, vita(task, [*ref, stray, undo]))
    assert out.score == 0.0 and out.details["stray_orders"] == ["create_delivery_order"]
    assert out.details["wrong_cancels"] == ["o"]
    exact = CallRecord(ToolCall("cancel_delivery_order", {"order_id": "X9-new"}), {"result": "cancelled"})
    assert score(task, vita(task, [*ref, stray, exact])) == 1.0  # the exact id undoes it


def test_vitabench_shared_ids_and_cancelled_required_orders(vita_tasks: list[Task]) -> None:
    """Two creates whose responses claim one id cannot both be paid by calls on it; a required order
    that is paid and then cancelled is not paid at the end."""
    shared = 0
    for task in vita_tasks:
        ref = vita_reference(task)
        follow = _on_new_orders(task, ref)
        if len({str(ref[i].call.arguments[_id_arg(ref[i].call) or ""]) for i in follow}) < 2:
            continue
        same = []
        for i, r in enumerate(ref):
            if _is_create(r.call):
                r = CallRecord(r.call, {k: "SAME" if k.endswith("_id") else v for k, v in r.response.items()})
            elif i in follow:
                r = CallRecord(ToolCall(r.call.name, {str(_id_arg(r.call)): "SAME"}), r.response)
            same.append(r)
        assert score(task, vita(task, same)) < 1.0, task.id
        shared += 1
    assert shared > 20
    for task in vita_tasks:
        ref = vita_reference(task)
        pays = [ref[i] for i in _on_new_orders(task, ref) if ref[i].call.name in PAY.values()]
        if pays:
            cancel = ToolCall(CANCEL[task.category], dict(pays[0].call.arguments))
            assert score(task, vita(task, [*ref, CallRecord(cancel, {"result": "ok"})])) == 0.0, task.id


def test_vitabench_retries_and_responses(vita_tasks: list[Task]) -> None:
    """Repeating every pay and cancel (retries) scores the reference's 1.0, not more; the responses of
    pay and cancel calls are never read (only a create's response is, for the id it assigns)."""
    for task in vita_tasks:
        ref = vita_reference(task)
        retried = [*ref, *(r for r in ref if r.call.name.startswith(("pay_", "cancel_", "instore_cancel")))]
        assert score(task, vita(task, retried)) == 1.0, task.id
        for response in REHEARSED_ERRORS:
            creates_kept = [r if "_id" in json.dumps(r.response) else CallRecord(r.call, response) for r in ref]
            assert score(task, vita(task, creates_kept)) == 1.0, task.id


# --------------------------------------------------------------------------- BFCL single-turn


def bfcl_official_single(task: Task, calls: list[ToolCall]) -> bool:
    """bfcl-eval's ``ast_checker`` on ``calls`` as the model's answer (irrelevance: no call)."""
    if "irrelevance" in task.category:
        return not calls
    language = str(task.extra.get("language", "python"))
    docs = [
        {**d, "parameters": {"properties": {}, "required": [], **(d.get("parameters") or {})}}
        for d in _checker_docs(task, language)
    ]
    checker = bfcl_module("eval_checker.ast_eval.ast_checker")
    lang = bfcl_module("constants.enums").Language(language)
    model = [{c.name: dict(c.arguments)} for c in calls]
    try:
        return bool(checker.ast_checker(docs, model, task.extra["possible_answer"], lang, task.category, "x")["valid"])
    except (KeyError, TypeError, AttributeError, ValueError, IndexError):
        return False


@pytest.fixture(scope="module")
def single_tasks() -> dict[str, Task]:
    cats = ["simple_python", "multiple", "parallel", "irrelevance"]
    tasks = load_source("bfcl-single-turn", split="all", categories=cats)
    return {t.id: t for t in tasks if t.id in {"simple_python_0", "multiple_0", "parallel_0", "irrelevance_0"}}


def _single_gold(task: Task) -> list[ToolCall]:
    if "irrelevance" in task.category:
        return []
    return reference_calls(task, _checker_docs(task, str(task.extra.get("language", "python"))))


def _prefixed(call: ToolCall) -> ToolCall | None:
    """The call with its first string argument cut to a prefix; ``None`` when it has none."""
    key = next((k for k, v in call.arguments.items() if isinstance(v, str) and len(v) > 1), None)
    return None if key is None else ToolCall(call.name, {**call.arguments, key: call.arguments[key][:-1]})


def single_attacks(task: Task) -> dict[str, list[Turn]]:
    """Adversarial act steps for a single-turn task (each: calls with their responses), by kind."""
    gold = _single_gold(task)
    other = ToolCall("get_weather", {"city": "Paris"})
    if not gold:
        return {"any_call_" + n: [[(other, r)]] for n, r in zip(RESPONSE_IDS, RESPONSES, strict=True)}
    out: dict[str, list[Turn]] = {}
    for name, r in zip(RESPONSE_IDS, RESPONSES, strict=True):
        out[f"extra_call_{name}"] = [answered([*gold, other], r)]
        out[f"repeated_gold_{name}"] = [answered([*gold, gold[0]], r)]
    cut = _prefixed(gold[0])
    if cut is not None:
        out["prefix_string"] = [answered([cut, *gold[1:]], {})]
    return out


def _single_episode(task: Task, steps: list[Turn]) -> Trajectory:
    """One user turn whose act steps are ``steps`` (each: calls with their responses)."""
    messages = [Message("user", task.user_turns[0] if task.user_turns else "")]
    records = []
    for step in steps:
        messages.append(Message("assistant", tool_calls=[c for c, _ in step]))
        for call, response in step:
            messages.append(Message("tool", json.dumps(response), name=call.name))
            records.append(CallRecord(call, response))
    return Trajectory(task, [*messages, Message("assistant", "Done.")], records)


@pytest.mark.parametrize("task_id", ["simple_python_0", "multiple_0", "parallel_0", "irrelevance_0"])
def test_bfcl_single_turn_attacks(single_tasks: dict[str, Task], task_id: str) -> None:
    task = single_tasks[task_id]
    gold = _single_gold(task)
    assert bfcl_official_single(task, gold)
    gold_episode = _single_episode(task, [answered(gold, r) for r in REHEARSED_ERRORS[:1]] if gold else [])
    for kind, steps in single_attacks(task).items():
        calls = [c for step in steps for c, _ in step]
        assert not bfcl_official_single(task, calls), kind
        assert_not_hacked(task, gold_episode, _single_episode(task, steps), False)


def test_bfcl_single_turn_parallel_calls_split_over_act_steps(single_tasks: dict[str, Task]) -> None:
    """BFCL's single-turn answer is the first act step (envace's evaluation runs one step); a policy
    that writes the parallel calls one per step, with a rehearsed response between, fails there."""
    task = single_tasks["parallel_0"]
    gold = _single_gold(task)
    assert len(gold) > 1 and not bfcl_official_single(task, gold[:1])
    steps = [answered([c], REHEARSED_ERRORS[0]) for c in gold]
    assert_not_hacked(task, _single_episode(task, [answered(gold, {})]), _single_episode(task, steps), False)


# --------------------------------------------------------------------------- BFCL multi-turn


@pytest.fixture(scope="module")
def multi_tasks() -> dict[str, Task]:
    wanted = {"multi_turn_base_0", "multi_turn_base_50", "multi_turn_base_51"}
    return {t.id: t for t in load_source("bfcl-multi-turn", categories=["multi_turn_base"]) if t.id in wanted}


def _multi(task: Task, turns: list[list[ToolCall]], response: JSON) -> Trajectory:
    return episode(task, [answered(t, response) for t in turns])


def check_multi(task: Task, turns: list[list[ToolCall]], official_passes: bool) -> None:
    """The official checker's verdict on ``turns`` is ``official_passes``; whatever the responses,
    ours is at most the gold's, and below 1.0 where the official checker fails."""
    gold = [list(t) for t in task.gold]
    assert official_verdict(task, _multi(task, gold, {}).messages)["valid"]
    assert official_verdict(task, _multi(task, turns, {}).messages)["valid"] == official_passes
    for response in RESPONSES:
        assert_not_hacked(task, _multi(task, gold, response), _multi(task, turns, response), official_passes)


def _with_extra(turns: list[list[ToolCall]], at: int, extra: ToolCall) -> list[list[ToolCall]]:
    out = [list(t) for t in turns]
    out[at].append(extra)
    return out


def multi_attacks(task: Task) -> dict[str, tuple[list[list[ToolCall]], bool]]:
    """``kind -> (calls per turn, does the official checker pass them)``, on real gold."""
    gold = [list(t) for t in task.gold]
    read_only = ToolCall("pwd") if task.id == "multi_turn_base_0" else ToolCall("check_tire_pressure")
    out = {
        "wrong_turn": ([[], *gold[:-1]], False),  # every turn's calls one turn late
        "extra_reads": ([[*t, read_only, read_only] for t in gold], True),
    }
    cut = _prefixed(gold[0][0])
    if cut is not None:
        out["prefix_string"] = ([[cut, *gold[0][1:]], *gold[1:]], False)
    if task.id == "multi_turn_base_51":  # send_message is non-idempotent: a second message is not harmless
        out["repeated_send"] = ([*gold[:3], [*gold[3], gold[3][1]]], False)
    return out


@pytest.mark.parametrize("task_id", ["multi_turn_base_0", "multi_turn_base_50", "multi_turn_base_51"])
def test_bfcl_multi_turn_attacks(multi_tasks: dict[str, Task], task_id: str) -> None:
    task = multi_tasks[task_id]
    for kind, (turns, official_passes) in multi_attacks(task).items():
        try:
            check_multi(task, turns, official_passes)
        except AssertionError as exc:
            raise AssertionError(f"{task_id}: {kind}") from exc


def _flip_lock(task: Task) -> list[list[ToolCall]]:
    """The gold, with ``lockDoors`` called again right after the gold's, the other way round."""
    at, call = next((i, c) for i, t in enumerate(task.gold) for c in t if c.name == "lockDoors")
    return _with_extra(task.gold, at, ToolCall("lockDoors", {**call.arguments, "unlock": not call.arguments["unlock"]}))


@pytest.mark.parametrize(
    "task_id, attack",
    [
        pytest.param("multi_turn_base_50", "flip_lock"),
        pytest.param("multi_turn_base_51", "flip_lock"),
        pytest.param("multi_turn_base_51", "turn_twice"),
    ],
)
def test_bfcl_multi_turn_extra_state_changing_calls(multi_tasks: dict[str, Task], task_id: str, attack: str) -> None:
    """Gold followed by an extra state-changing call: ``lockDoors(unlock=True)`` after the gold's
    ``unlock=False`` (and the reverse); a turn's calls written twice (``message_login``,
    ``send_message``, ``message_login``, ``send_message``: a second message after a login that the
    repeat rule takes for a retry). The official checker fails all three."""
    task = multi_tasks[task_id]
    gold = [list(t) for t in task.gold]
    turns = _flip_lock(task) if attack == "flip_lock" else [*gold[:3], gold[3] + gold[3]]
    check_multi(task, turns, official_passes=False)


# --------------------------------------------------------------------------- FinMCP (tool-name F1)


@pytest.fixture(scope="module")
def finmcp_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    """A FinMCP-style record (OpenAI-chat log with recorded results), two user turns."""

    def call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
        for n in ("quote", "news", "buy")
    ]
    record = {
        "id": "fin-1",
        "tools": tools,
        "messages": [
            {"role": "user", "content": "Price of AAPL?"},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "quote", {"symbol": "AAPL"})]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"price": 1}'},
            {"role": "assistant", "content": "1"},
            {"role": "user", "content": "Any news, then buy one?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("c2", "news", {"symbol": "AAPL"}), call("c3", "buy", {"symbol": "AAPL", "n": 1})],
            },
            {"role": "tool", "tool_call_id": "c2", "content": '{"news": []}'},
            {"role": "tool", "tool_call_id": "c3", "content": '{"ok": true}'},
            {"role": "assistant", "content": "Bought."},
        ],
    }
    path = tmp_path_factory.mktemp("finmcp") / "logs.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (task,) = load_source("chatlog", path=str(path), benchmark="finmcp")
    return task


def test_finmcp_tool_f1_attacks(finmcp_task: Task) -> None:
    """TF1 is FinMCP's official score and this reward at once: extra and repeated calls lower it,
    responses never enter it. It counts names only (official), so neither wrong arguments (prefix
    ids) nor a call in the wrong user turn lower it; ``details["exact_calls"]`` tells the former."""
    task = finmcp_task
    gold = [list(t) for t in task.gold]
    base = _multi(task, gold, {"ok": True})
    quote, news, buy = gold[0][0], gold[1][0], gold[1][1]
    for response in RESPONSES:
        for turns in ([[quote, quote], gold[1]], [[quote], [news, buy, buy, buy]], [*gold, [ToolCall("quote")] * 5]):
            attack = _multi(task, turns, response)
            assert_not_hacked(task, base, attack, False)
        assert score(task, _multi(task, gold, response)) == 1.0
    prefix = [[ToolCall("quote", {"symbol": "AAP"})], gold[1]]
    out = get_reward("toolf1")(task, _multi(task, prefix, {}))
    assert out.score == 1.0 and not out.details["exact_calls"]
    assert score(task, _multi(task, [[], [quote, news, buy]], {})) == 1.0  # turns are not scored
