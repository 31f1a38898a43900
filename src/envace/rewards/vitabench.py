"""A deterministic proxy for VitaBench's LLM-judged score: did the episode place the required orders?

VitaBench's official score is an LLM judge over rubrics. Its tasks also list the orders, table
bookings and service reservations that must exist at the end (``extra["required_orders"]``, from
``expected_states``); this proxy reads the episode's calls against them, with no environment. It
reads the **calls**, and of the responses only the id a create call's response assigns (to link
the pay and cancel calls that name it); whether a response is an error is never read, so no
response (an error, an empty or malformed rehearsal) excuses a call:

- a **new** required order must be created by a create call with the same store and items:
  ``create_delivery_order`` (store, multiset of (product, count)); one
  ``create_instore_product_order`` per product line (the tool takes one product; shop, product,
  quantity); ``instore_book`` / ``instore_reservation`` (shop, time, customer count). Each create
  call serves one requirement;
- if its status is paid or later (``paid``, ``processed``, ``in-progress``, ``delivered``), a later
  pay call must name **exactly** the id that create call's response assigned (:func:`created_id`:
  the value of its ``order_id`` / ``book_id`` / ``reservation_id`` key; ids compare as strings, an
  integer id as its decimal digits, :func:`norm_id`); table bookings only when they cost something
  (``book_price > 0``); reservations have no pay tool. A required ``cancelled`` status needs a
  later cancel call on that id likewise. A create whose response assigns no id, or an id that
  another create or a pre-existing order also has, can be neither paid nor cancelled;
- a **pre-existing** order (``extra["initial_orders"]``) whose status must change to cancelled or
  paid needs the cancel or pay call on its id;
- gates, each zeroing the score: a create call that serves no requirement and that no later
  cancel call on its id undoes (a **stray order**); a pay call whose id is not that of a required
  order to be paid or cancelled, or of a booking or reservation left ``unconsumed`` (:data:`PAYABLE`)
  (a **stray pay**: another order, an order that must stay unpaid, an id no order has); a cancel
  call whose id is neither that of an order required to be cancelled nor that of a stray order it
  undoes (a **wrong cancel**: a pre-existing order that must stay, a new order that must stay, an id
  no order has).

``score = (passed checks / checks) * gates``; ``success`` = all of them. Not judged: addresses,
dispatch times, notes, product attributes, the modify tools (``modify_delivery_order``,
``instore_modify_reservation``) and every rubric about the conversation — the approximation is
"the right things were ordered, paid and cancelled". An order type this proxy does not know
(VitaBench's OTA and cross-domain tasks) masks the episode (score ``None``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from envace.rewards.base import RewardOutput
from envace.types import Task, ToolCall, Trajectory

CREATE_TOOLS = {
    "create_delivery_order": "order",
    "create_instore_product_order": "order",
    "instore_book": "book",
    "instore_reservation": "reservation",
}
PAY_TOOLS = {"order": ("pay_delivery_order", "pay_instore_order"), "book": ("pay_instore_book",), "reservation": ()}
CANCEL_TOOLS = {
    "order": ("cancel_delivery_order", "instore_cancel_order"),
    "book": ("instore_cancel_book",),
    "reservation": ("instore_cancel_reservation",),
}
PAID = {"paid", "processed", "in-progress", "delivered"}
#: required statuses under which a pay call is absorbed: paid or later, cancelled (paid, then
#: cancelled), and ``unconsumed`` (a booking or reservation; the data does not say whether it was paid)
PAYABLE = PAID | {"cancelled", "unconsumed"}
#: the key that holds an order's id (in the data and in the tools' arguments), and the kind it names
ID_KEYS: dict[str, str] = {"order_id": "order", "book_id": "book", "reservation_id": "reservation"}
ID_ARG = {kind: key for key, kind in ID_KEYS.items()}
#: follow-up tool -> (what it does, the kind of order it acts on)
FOLLOW_UPS: dict[str, tuple[str, str]] = {
    **{tool: ("pay", kind) for kind, tools in PAY_TOOLS.items() for tool in tools},
    **{tool: ("cancel", kind) for kind, tools in CANCEL_TOOLS.items() for tool in tools},
}
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


def norm_id(value: Any) -> str | None:
    """An id as the string it is compared by: a non-empty string as it is, an integer (not a
    boolean) as its decimal digits; anything else is no id. Equality only: never a substring or
    prefix, no case folding, no stripping.

    >>> norm_id("N7"), norm_id(7), norm_id(" N7"), norm_id(""), norm_id(True), norm_id(7.0)
    ('N7', '7', ' N7', None, None, None)
    """
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _values(response: Any, key: str) -> Iterator[Any]:
    """Every value held under ``key`` anywhere in a JSON ``response``; a string that is itself a JSON
    object or array (a text response wrapped as ``{"result": "..."}``) is read too."""
    if isinstance(response, str) and response.lstrip()[:1] in ("{", "["):
        try:
            response = json.loads(response)
        except (ValueError, RecursionError):
            return
    if isinstance(response, dict):
        for k, v in response.items():
            if k == key:
                yield v
            yield from _values(v, key)
    elif isinstance(response, list):
        for v in response:
            yield from _values(v, key)


def created_id(response: Any, kind: str) -> str | None:
    """The id a create call's response assigns: the one distinct :func:`norm_id` value under the
    kind's id key (``order_id``, ``book_id``, ``reservation_id``); ``None`` when there is none (an
    error, an empty rehearsal) or more than one (the response does not say which).

    >>> created_id({"order_id": "N7", "status": "unpaid"}, "order"), created_id({"order": {"order_id": 7}}, "order")
    ('N7', '7')
    >>> created_id({"error": {"code": "EMPTY_OUTPUT", "message": "m"}}, "order"), created_id({"book_id": "B"}, "order")
    (None, None)
    >>> created_id([{"order_id": "A"}, {"order_id": "B"}], "order") is None
    True
    """
    ids = {norm_id(v) for v in _values(response, ID_ARG[kind])} - {None}
    return ids.pop() if len(ids) == 1 else None


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


class _Checker:
    """Walks the required orders of one task against one episode's calls.

    ``creates`` are ``(position, call, kind, id)`` of every create call; ``follow_ups`` are
    ``(position, "pay" | "cancel", kind, id)`` of every pay and cancel call; ``allowed`` maps each
    ``(action, kind, id)`` that a required order (or undoing a stray order) absorbs to the position
    after which it is absorbed, so that the gates can tell the other calls.
    """

    def __init__(self, task: Task, traj: Trajectory) -> None:
        self.initial: dict[str, dict[str, str]] = task.extra.get("initial_orders") or {}
        made = [(i, r) for i, r in enumerate(traj.calls) if r.call.name in CREATE_TOOLS]
        ids = [created_id(r.response, CREATE_TOOLS[r.call.name]) for _, r in made]
        shared = {k for k, n in Counter(ids).items() if n > 1} | set(self.initial)
        self.creates = [
            (i, r.call, CREATE_TOOLS[r.call.name], None if oid in shared else oid)
            for (i, r), oid in zip(made, ids, strict=True)
        ]
        self.follow_ups: list[tuple[int, str, str, str | None]] = []
        for i, r in enumerate(traj.calls):
            if r.call.name in FOLLOW_UPS:
                action, kind = FOLLOW_UPS[r.call.name]
                self.follow_ups.append((i, action, kind, norm_id(r.call.arguments.get(ID_ARG[kind]))))
        self.used: set[int] = set()
        self.allowed: dict[tuple[str, str, str], int] = {}
        self.checks: list[dict[str, Any]] = []

    def check(self, what: str, oid: str, ok: bool) -> None:
        self.checks.append({"check": what, "id": oid, "ok": ok})

    def allow(self, action: str, kind: str, oid: str | None, after: int = -1) -> None:
        if oid is not None:
            key = (action, kind, oid)
            self.allowed[key] = min(after, self.allowed.get(key, after))

    def acted(self, action: str, kind: str, oid: str | None, after: int = -1) -> bool:
        """Some ``action`` call ("pay" or "cancel") on the ``kind`` order ``oid``, after position ``after``."""
        return oid is not None and any(f[1:] == (action, kind, oid) and f[0] > after for f in self.follow_ups)

    def existing(self, kind: str, oid: str, status: str) -> None:
        before = self.initial[oid]["status"]
        if status in PAYABLE:
            self.allow("pay", kind, oid)
        if status == "cancelled":
            self.allow("cancel", kind, oid)
            if before != "cancelled":
                self.check("cancel", oid, self.acted("cancel", kind, oid))
        elif status in PAID and before == "unpaid":
            self.check("pay", oid, self.acted("pay", kind, oid))

    def new(self, order: dict[str, Any], kind: str, oid: str, preds: list[Pred]) -> None:
        status = str(order.get("status", ""))
        needs_pay = status in PAID and (kind == "order" or (kind == "book" and (order.get("book_price") or 0) > 0))
        for pred in preds:
            j = next((j for j, c in enumerate(self.creates) if j not in self.used and pred(c[1])), None)
            self.check("create", oid, j is not None)
            at, new_id = (self.creates[j][0], self.creates[j][3]) if j is not None else (-1, None)
            if j is not None:
                self.used.add(j)
                if status in PAYABLE:
                    self.allow("pay", kind, new_id, after=at)
                if status == "cancelled":
                    self.allow("cancel", kind, new_id, after=at)
            if needs_pay:
                self.check("pay", oid, self.acted("pay", kind, new_id, after=at))
            if status == "cancelled":
                self.check("cancel", oid, self.acted("cancel", kind, new_id, after=at))

    def stray(self) -> list[str]:
        """Unused create calls that no later cancel call on their id undoes (the undoing cancels
        are then absorbed)."""
        out = []
        for j, (at, call, kind, oid) in enumerate(self.creates):
            if j in self.used:
                continue
            if self.acted("cancel", kind, oid, after=at):
                self.allow("cancel", kind, oid, after=at)
            else:
                out.append(call.name)
        return out

    def unabsorbed(self, action: str) -> list[str | None]:
        """The ids of the ``action`` calls that nothing absorbs (call :meth:`stray` first)."""
        out = []
        for at, act, kind, oid in self.follow_ups:
            after = self.allowed.get((act, kind, oid)) if oid is not None else None
            if act == action and (after is None or at <= after):
                out.append(oid)
        return out


def vitabench_proxy(task: Task, traj: Trajectory) -> RewardOutput:
    """Score a VitaBench episode by the orders it placed, paid and cancelled (see the module docstring).

    >>> order = {"order_id": "T1", "order_type": "delivery", "store_id": "S", "status": "paid",
    ...          "products": [{"product_id": "P", "quantity": 2}]}
    >>> t = Task("t", "vitabench", extra={"required_orders": [order], "initial_orders": {}})
    >>> create = ToolCall("create_delivery_order", {"store_id": "S", "product_ids": ["P"], "product_cnts": [2]})
    >>> from envace.types import CallRecord
    >>> made = CallRecord(create, {"order_id": "N7"})
    >>> run = [made, CallRecord(ToolCall("pay_delivery_order", {"order_id": "N7"}), {"result": "Payment successful"})]
    >>> vitabench_proxy(t, Trajectory(t, [], run)).score, vitabench_proxy(t, Trajectory(t, [], run[:1])).score
    (1.0, 0.5)
    >>> prefix = CallRecord(ToolCall("pay_delivery_order", {"order_id": "N"}), {"result": "Payment successful"})
    >>> out = vitabench_proxy(t, Trajectory(t, [], [made, prefix]))
    >>> out.score, out.details["stray_pays"]
    (0.0, ['N'])
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
    stray_pays, wrong_cancels = checker.unabsorbed("pay"), checker.unabsorbed("cancel")
    passed = [c["ok"] for c in checker.checks]
    fraction = sum(passed) / len(passed) if passed else 1.0
    gates = not stray and not stray_pays and not wrong_cancels
    return RewardOutput(
        score=fraction if gates else 0.0,
        success=all(passed) and gates,
        details={
            "checks": checker.checks,
            "stray_orders": stray,
            "stray_pays": stray_pays,
            "wrong_cancels": wrong_cancels,
            "fraction": fraction,
        },
    )
