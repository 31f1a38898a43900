"""The VitaBench proxy on the shipped delivery/instore tasks: reference episodes built from the
required orders score 1, the empty episode scores 0, and single changes to a reference call lower it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from envace.data.sources.vitabench import load_vitabench
from envace.rewards.vitabench import PAID, order_key, vitabench_proxy
from envace.types import CallRecord, Task, ToolCall, Trajectory

# the data folder is the `vitabench_data` fixture (tests/conftest.py): skipped where it is absent


def _creates(order: dict, uid: str, oid: str) -> list[tuple[ToolCall, str]]:
    """The create calls (with the id the environment would assign) that place one required order."""
    kind, _ = order_key(order)
    if kind in ("book", "reservation"):
        when = order.get("book_time") or order["reservation_time"]
        args = {"user_id": uid, "shop_id": order["shop_id"], "time": when, "customer_count": order["customer_count"]}
        return [(ToolCall("instore_book" if kind == "book" else "instore_reservation", args), f"{oid}-new")]
    products = order["products"]
    if order["order_type"] == "delivery":
        args = {
            "user_id": uid,
            "store_id": order["store_id"],
            "product_ids": [p["product_id"] for p in products],
            "product_cnts": [p["quantity"] for p in products],
            "address": "home",
            "dispatch_time": "2025-01-01 12:00:00",
        }
        return [(ToolCall("create_delivery_order", args), f"{oid}-new")]
    return [
        (
            ToolCall(
                "create_instore_product_order",
                {
                    "user_id": uid,
                    "shop_id": order["store_id"],
                    "product_id": p["product_id"],
                    "quantity": p["quantity"],
                },
            ),
            f"{oid}-new{k}",
        )
        for k, p in enumerate(products)
    ]


def reference_episode(task: Task) -> Trajectory:
    """Calls that place, pay and cancel exactly what ``required_orders`` asks for."""
    domain_pay = {"delivery": "pay_delivery_order", "instore": "pay_instore_order"}
    domain_cancel = {"delivery": "cancel_delivery_order", "instore": "instore_cancel_order"}
    calls: list[CallRecord] = []
    for order in task.extra["required_orders"]:
        kind, oid = order_key(order)
        status = order["status"]
        cancel = {"order": domain_cancel[task.category], "book": "instore_cancel_book"}.get(
            kind, "instore_cancel_reservation"
        )
        pay = {"order": domain_pay[task.category], "book": "pay_instore_book"}.get(kind)
        arg = f"{kind}_id"
        before = task.extra["initial_orders"].get(oid)
        if before is not None:
            if status == "cancelled" and before["status"] != "cancelled":
                calls.append(CallRecord(ToolCall(cancel, {arg: oid}), {"result": "cancelled"}))
            elif status in PAID and before["status"] == "unpaid":
                calls.append(CallRecord(ToolCall(pay, {arg: oid}), {"result": "Payment successful"}))
            continue
        for call, new_id in _creates(order, task.extra["user_id"], oid):
            calls.append(CallRecord(call, {arg: new_id, "status": "unpaid"}))
            if pay and status in PAID and (kind == "order" or order.get("book_price", 0) > 0):
                calls.append(CallRecord(ToolCall(pay, {arg: new_id}), {"result": "Payment successful"}))
            if status == "cancelled":
                calls.append(CallRecord(ToolCall(cancel, {arg: new_id}), {"result": "cancelled"}))
    return Trajectory(task, [], calls, source="reference")


@pytest.fixture(scope="module")
def tasks(vitabench_data: Path) -> list[Task]:
    return load_vitabench(path=str(vitabench_data))


def test_reference_episodes_score_one_and_empty_scores_zero(tasks: list[Task]) -> None:
    gold = [vitabench_proxy(t, reference_episode(t)) for t in tasks]
    assert all(r.score == 1.0 and r.success for r in gold), [r.details for r in gold if not r.success][:2]
    empty = [vitabench_proxy(t, Trajectory(t, [])) for t in tasks]
    # every shipped task asks for at least one change (a new order, a payment or a cancellation)
    assert all(r.score == 0.0 and not r.success for r in empty)


def test_single_argument_changes_lower_the_score(tasks: list[Task]) -> None:
    lowered = 0
    for task in tasks[::10]:
        episode = reference_episode(task)
        for i, record in enumerate(episode.calls):
            for key in ("store_id", "shop_id", "product_id", "time", "order_id", "book_id"):
                if key not in record.call.arguments:
                    continue
                changed = copy.deepcopy(episode)
                args = dict(record.call.arguments, **{key: "WRONG"})
                changed.calls[i] = CallRecord(ToolCall(record.call.name, args), record.response)
                assert vitabench_proxy(task, changed).score < 1.0, (task.id, record.call.name, key)
                lowered += 1
    assert lowered > 20


def test_stray_order_and_wrong_cancel_gate_the_score(tasks: list[Task]) -> None:
    task = next(t for t in tasks if t.category == "delivery")
    episode = reference_episode(task)
    extra = ToolCall("create_delivery_order", {"store_id": "S-other", "product_ids": ["P"], "product_cnts": [1]})
    stray = Trajectory(task, [], [*episode.calls, CallRecord(extra, {"order_id": "X9"})])
    out = vitabench_proxy(task, stray)
    assert out.score == 0.0 and out.details["stray_orders"] == ["create_delivery_order"]
    undone = Trajectory(task, [], [*stray.calls, CallRecord(ToolCall("cancel_delivery_order", {"order_id": "X9"}), {})])
    assert vitabench_proxy(task, undone).score == 1.0
    # the response excuses nothing: a stray create that "failed" (a rehearsed error) is stray all the same
    failed = Trajectory(task, [], [*episode.calls, CallRecord(extra, {"error": {"code": "E", "message": "m"}})])
    out = vitabench_proxy(task, failed)
    assert out.score == 0.0 and out.details["stray_orders"] == ["create_delivery_order"]


def test_pre_existing_orders() -> None:
    keep = {"order_id": "OLD1", "order_type": "delivery", "status": "paid", "store_id": "S", "products": []}
    drop = {"order_id": "OLD2", "order_type": "delivery", "status": "cancelled", "store_id": "S", "products": []}
    initial = {"OLD1": {"kind": "order", "status": "paid"}, "OLD2": {"kind": "order", "status": "paid"}}
    task = Task("t", "vitabench", "delivery", extra={"required_orders": [keep, drop], "initial_orders": initial})
    cancel2 = CallRecord(ToolCall("cancel_delivery_order", {"order_id": "OLD2"}), {"result": "ok"})
    cancel1 = CallRecord(ToolCall("cancel_delivery_order", {"order_id": "OLD1"}), {"result": "ok"})
    assert vitabench_proxy(task, Trajectory(task, [], [cancel2])).score == 1.0
    assert vitabench_proxy(task, Trajectory(task, [], [])).score == 0.0
    wrong = vitabench_proxy(task, Trajectory(task, [], [cancel2, cancel1]))
    assert wrong.score == 0.0 and wrong.details["wrong_cancels"] == ["OLD1"]


def test_unknown_order_type_is_masked() -> None:
    hotel = {"order_id": "H1", "order_type": "hotel", "status": "paid", "products": []}
    task = Task("t", "vitabench", "ota", extra={"required_orders": [hotel], "initial_orders": {}})
    out = vitabench_proxy(task, Trajectory(task, []))
    assert out.score is None and out.masked
