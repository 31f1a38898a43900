"""A deterministic proxy for VitaBench's LLM-judged score: did the episode place the required orders?

VitaBench's official score is an LLM judge over rubrics. Its tasks also list the orders, table
bookings and service reservations that must exist at the end (``extra["required_orders"]``, from
``expected_states``); this proxy reads the episode's calls against them, with no environment:

- a **new** required order must be created by a successful create call with the same store and
  items: ``create_delivery_order`` (store, multiset of (product, count)); one
  ``create_instore_product_order`` per product line (the tool takes one product; shop, product,
  quantity); ``instore_book`` / ``instore_reservation`` (shop, time, customer count). Each create
  call serves one requirement;
- if its status is paid or later (``paid``, ``processed``, ``in-progress``, ``delivered``), a pay
  call must name an id that occurs in that create call's response (the id is assigned by the
  environment, or rehearsed); table bookings only when they cost something (``book_price > 0``);
  reservations have no pay tool. A required ``cancelled`` status needs a cancel call likewise;
- a **pre-existing** order (``extra["initial_orders"]``) whose status must change to cancelled or
  paid needs the cancel or pay call on its id;
- gates: a successful create call that serves no requirement and is not cancelled later (a stray
  order), or a cancel call on a pre-existing order that must stay, zeroes the score.

``score = (passed checks / checks) * gates``; ``success`` = all of them. Not judged: addresses,
dispatch times, notes, product attributes and every rubric about the conversation — the
approximation is "the right things were ordered, paid and cancelled". An order type this proxy does
not know (VitaBench's OTA and cross-domain tasks) masks the episode (score ``None``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from envace.rewards.base import RewardOutput
from envace.types import CallRecord, Task, ToolCall, Trajectory, is_error

CREATE_TOOLS = {"create_delivery_order", "create_instore_product_order", "instore_book", "instore_reservation"}
PAY_TOOLS = {"order": ("pay_delivery_order", "pay_instore_order"), "book": ("pay_instore_book",), "reservation": ()}
CANCEL_TOOLS = {
    "order": ("cancel_delivery_order", "instore_cancel_order"),
    "book": ("instore_cancel_book",),
    "reservation": ("instore_cancel_reservation",),
}
ALL_CANCEL = tuple(name for names in CANCEL_TOOLS.values() for name in names)
PAID = {"paid", "processed", "in-progress", "delivered"}
#: the key that holds an order's id (in the data and in the tools' arguments), and the kind it names
ID_KEYS: dict[str, str] = {"order_id": "order", "book_id": "book", "reservation_id": "reservation"}
ID_ARG = {kind: key for key, kind in ID_KEYS.items()}
Pred = Callable[[ToolCall], bool]


def order_key(order: dict[str, Any]) -> tuple[str, str]:
    """``(kind, id)`` of a required order, booking or reservation.

    >>> order_key({"book_id": "B1", "shop_id": "S"})
    ('book', 'B1')
    """
    for key, kind in ID_KEYS.items():
        if order.get(key):
            return kind, str(order[key])
    raise ValueError("no order_id, book_id or reservation_id")


def _count(value: Any, default: int = 1) -> Any:
    return default if value is None else value


def _slot_pred(tool: str, want: tuple[Any, ...]) -> Pred:
    """A booking or reservation call at ``want = (shop, time, customer count)``."""
    return lambda c: c.name == tool and _slot(c.arguments) == want


def _slot(a: dict[str, Any]) -> tuple[Any, ...]:
    return a.get("shop_id"), a.get("time"), _count(a.get("customer_count"))


def _instore_pred(store: Any, pid: Any, qty: Any) -> Pred:
    """One ``create_instore_product_order`` of ``qty`` x product ``pid`` at shop ``store``."""
    want = (store, pid, qty)
    return lambda c: (
        c.name == "create_instore_product_order"
        and (
            c.arguments.get("shop_id"),
            c.arguments.get("product_id"),
            _count(c.arguments.get("quantity")),
        )
        == want
    )


def _delivery_pred(store: Any, lines: Counter[tuple[Any, Any]]) -> Pred:
    """One ``create_delivery_order`` at ``store`` with exactly the (product, count) multiset ``lines``."""

    def pred(c: ToolCall) -> bool:
        a = c.arguments
        got = Counter(zip(a.get("product_ids") or [], a.get("product_cnts") or [], strict=False))
        return c.name == "create_delivery_order" and a.get("store_id") == store and got == lines

    return pred


def create_predicates(order: dict[str, Any]) -> list[Pred] | None:
    """One predicate per create call the required ``order`` needs; ``None`` for an unknown order type."""
    kind, _ = order_key(order)
    if kind in ("book", "reservation"):
        tool = "instore_book" if kind == "book" else "instore_reservation"
        when = order.get("book_time") or order.get("reservation_time")  # a few records use the other name
        return [_slot_pred(tool, (order.get("shop_id"), when, _count(order.get("customer_count"))))]
    lines = Counter((p.get("product_id"), _count(p.get("quantity"))) for p in order.get("products") or [])
    if order.get("order_type") == "delivery":
        return [_delivery_pred(order.get("store_id"), lines)]
    if order.get("order_type") == "instore":
        return [_instore_pred(order.get("store_id"), pid, qty) for (pid, qty), n in lines.items() for _ in range(n)]
    return None


def _mentions(response: Any, oid: Any) -> bool:
    return isinstance(oid, str) and bool(oid) and oid in json.dumps(response, ensure_ascii=False)


def _acted(calls: list[CallRecord], tools: tuple[str, ...], arg: str, hit: Callable[[Any], bool]) -> bool:
    """Some successful call to one of ``tools`` whose ``arg`` satisfies ``hit``."""
    return any(r.call.name in tools and not is_error(r.response) and hit(r.call.arguments.get(arg)) for r in calls)


class _Checker:
    """Walks the required orders of one task against one episode's calls."""

    def __init__(self, task: Task, traj: Trajectory) -> None:
        self.calls = list(traj.calls)
        self.initial: dict[str, dict[str, str]] = task.extra.get("initial_orders") or {}
        self.creates = [r for r in self.calls if r.call.name in CREATE_TOOLS and not is_error(r.response)]
        self.used: set[int] = set()
        self.checks: list[dict[str, Any]] = []
        self.wrong_cancels: list[str] = []

    def check(self, what: str, oid: str, ok: bool) -> None:
        self.checks.append({"check": what, "id": oid, "ok": ok})

    def existing(self, kind: str, oid: str, status: str) -> None:
        before = self.initial[oid]["status"]
        cancelled = _acted(self.calls, CANCEL_TOOLS[kind], ID_ARG[kind], lambda v: v == oid)
        if status == "cancelled" and before != "cancelled":
            self.check("cancel", oid, cancelled)
        elif status in PAID and before == "unpaid":
            self.check("pay", oid, _acted(self.calls, PAY_TOOLS[kind], ID_ARG[kind], lambda v: v == oid))
        if status != "cancelled" and cancelled:
            self.wrong_cancels.append(oid)

    def new(self, order: dict[str, Any], kind: str, oid: str, preds: list[Pred]) -> None:
        status = str(order.get("status", ""))
        needs_pay = status in PAID and (kind == "order" or (kind == "book" and (order.get("book_price") or 0) > 0))
        for pred in preds:
            i = next((i for i, r in enumerate(self.creates) if i not in self.used and pred(r.call)), None)
            self.check("create", oid, i is not None)
            response = self.creates[i].response if i is not None else None
            if i is not None:
                self.used.add(i)
            if needs_pay:
                self.check("pay", oid, i is not None and self.follow_up(PAY_TOOLS[kind], kind, response))
            if status == "cancelled":
                self.check("cancel", oid, i is not None and self.follow_up(CANCEL_TOOLS[kind], kind, response))

    def follow_up(self, tools: tuple[str, ...], kind: str, created: Any) -> bool:
        """A successful call to one of ``tools`` naming an id that the create response ``created`` mentions."""
        return _acted(self.calls, tools, ID_ARG[kind], lambda v: _mentions(created, v))

    def stray(self) -> list[str]:
        """Unused successful create calls that no later cancel call undoes."""
        out = []
        for i, r in enumerate(self.creates):
            undone = any(
                c.call.name in ALL_CANCEL
                and not is_error(c.response)
                and any(_mentions(r.response, v) for v in c.call.arguments.values())
                for c in self.calls
            )
            if i not in self.used and not undone:
                out.append(r.call.name)
        return out


def vitabench_proxy(task: Task, traj: Trajectory) -> RewardOutput:
    """Score a VitaBench episode by the orders it placed, paid and cancelled (see the module docstring).

    >>> order = {"order_id": "T1", "order_type": "delivery", "store_id": "S", "status": "paid",
    ...          "products": [{"product_id": "P", "quantity": 2}]}
    >>> t = Task("t", "vitabench", extra={"required_orders": [order], "initial_orders": {}})
    >>> create = ToolCall("create_delivery_order", {"store_id": "S", "product_ids": ["P"], "product_cnts": [2]})
    >>> pay = ToolCall("pay_delivery_order", {"order_id": "N7"})
    >>> run = [CallRecord(create, {"order_id": "N7"}), CallRecord(pay, {"result": "Payment successful"})]
    >>> vitabench_proxy(t, Trajectory(t, [], run)).score, vitabench_proxy(t, Trajectory(t, [], run[:1])).score
    (1.0, 0.5)
    """
    checker = _Checker(task, traj)
    for order in task.extra.get("required_orders") or []:
        kind, oid = order_key(order)
        if oid in checker.initial:
            checker.existing(kind, oid, str(order.get("status", "")))
            continue
        preds = create_predicates(order)
        if preds is None:
            return RewardOutput(None, False, {"masked": f"unknown order type {order.get('order_type')!r}"})
        checker.new(order, kind, oid, preds)
    stray = checker.stray()
    passed = [c["ok"] for c in checker.checks]
    fraction = sum(passed) / len(passed) if passed else 1.0
    gates = not stray and not checker.wrong_cancels
    return RewardOutput(
        score=fraction if gates else 0.0,
        success=all(passed) and gates,
        details={
            "checks": checker.checks,
            "stray_orders": stray,
            "wrong_cancels": checker.wrong_cancels,
            "fraction": fraction,
        },
    )
