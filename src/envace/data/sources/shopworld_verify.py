"""``envace data verify --source shopworld``: the ``gold-writes`` reward against the state-replay oracle.

The reward reads the calls only; the oracle (:func:`oracle_success`) runs them in a fresh world and
compares what they leave with what the gold leaves: the order book, the required reads answered, no
write refused. Before any run they must agree on every gold episode and on every perturbation below,
each a way a policy could go wrong (or right: free reads added or left out). A disagreement is a
failure, printed with the task and the calls.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from envace.data.sources import VerifyReport
from envace.data.sources.shopworld import load_shopworld
from envace.envs.shopworld import WRITE_TOOLS, catalogue, final_state
from envace.rewards.gold import gold_writes
from envace.types import Message, Task, ToolCall, Trajectory

Calls = list[ToolCall]


def oracle_success(task: Task, calls: Calls) -> bool:
    """Whether ``calls`` leave the world as the gold leaves it: the same order book, the task's
    required reads answered as the gold's were, and no write refused."""
    orders = task.extra.get("metadata", {}).get("orders")
    made = final_state([(c.name, dict(c.arguments)) for c in calls], orders)
    gold = final_state([(c.name, dict(c.arguments)) for c in task.gold[0]], orders)
    required = set(task.extra["scored_tools"]) - set(WRITE_TOOLS)

    def reads(state: dict) -> list:
        return [r for r in state["reads"] if r[0] in required]

    return made["book"] == gold["book"] and reads(made) == reads(gold) and made["refused_writes"] == 0


def _with_sku(call: ToolCall, sku: str) -> ToolCall:
    return ToolCall(call.name, {**call.arguments, "sku": sku})


def _other_sku(sku: str, rng: random.Random) -> str:
    return rng.choice([s for s, p in catalogue().items() if s != sku and p.in_stock])


def _map_first(calls: Calls, pick: Callable[[ToolCall], bool], change: Callable[[ToolCall], ToolCall]) -> Calls | None:
    """``calls`` with the first one ``pick`` selects changed; ``None`` when none is selected."""
    for i, c in enumerate(calls):
        if pick(c):
            return [*calls[:i], change(c), *calls[i + 1 :]]
    return None


def _writes(calls: Calls) -> list[int]:
    return [i for i, c in enumerate(calls) if c.name in WRITE_TOOLS]


def perturbations(task: Task, rng: random.Random) -> dict[str, Calls | None]:
    """The gold and its perturbations (``None``: the kind does not apply to this task)."""
    gold = list(task.gold[0])
    ordered = lambda c: c.name == "place_order"  # noqa: E731
    has_id = lambda c: "order_id" in c.arguments  # noqa: E731
    first = _writes(gold)[0]
    free = [ToolCall("search_products", {"query": rng.choice(list(catalogue().values())).name}),
            ToolCall("list_orders", {})]  # fmt: skip
    orders = task.extra.get("metadata", {}).get("orders") or []
    other_id = next((o["order_id"] for o in orders if o["order_id"] != gold[-1].arguments.get("order_id")), "A1002")
    scored = [c for c in gold if c.name in task.extra["scored_tools"]]
    return {
        "gold": gold,
        "free_reads_added": [free[0], *gold[:first], free[1], *gold[first:]],
        "free_reads_dropped": scored,
        "wrong_sku": _map_first(gold, ordered, lambda c: _with_sku(c, _other_sku(c.arguments["sku"], rng))),
        "unknown_sku": _map_first(gold, ordered, lambda c: _with_sku(c, "Z0Z0")),
        "lowercased_sku": _map_first(gold, ordered, lambda c: _with_sku(c, c.arguments["sku"].lower())),
        "quantity_off_by_one": _map_first(
            gold, ordered, lambda c: ToolCall(c.name, {**c.arguments, "quantity": c.arguments["quantity"] % 5 + 1})
        ),
        "quantity_as_float": _map_first(
            gold, ordered, lambda c: ToolCall(c.name, {**c.arguments, "quantity": float(c.arguments["quantity"])})
        ),
        "quantity_as_text": _map_first(
            gold, ordered, lambda c: ToolCall(c.name, {**c.arguments, "quantity": str(c.arguments["quantity"])})
        ),
        "wrong_order_id": _map_first(gold, has_id, lambda c: ToolCall(c.name, {"order_id": other_id})),
        "last_write_dropped": [c for i, c in enumerate(gold) if i != _writes(gold)[-1]],
        "first_write_repeated": [*gold, gold[first]],
        "extra_order": [*gold, ToolCall("place_order", {"sku": _other_sku("", rng), "quantity": 1})],
        "scored_calls_reversed": list(reversed(scored)) if len(scored) > 1 else None,
        "required_read_dropped": [c for c in gold if c.name != "order_status"]
        if "order_status" in task.extra["scored_tools"]
        else None,
        "other_choice": _other_choice(task, gold),
    }


def _other_choice(task: Task, gold: Calls) -> Calls | None:
    """S2: order the dearer product; S3: order the other of X and Y (the out-of-stock X tried first when
    X is out, a refused write)."""
    if task.category not in ("S2_cheaper", "S3_fallback"):
        return None
    names = [c.arguments["query"] for c in gold if c.name == "search_products"]
    chosen = gold[-1]
    skus = [p.sku for p in catalogue().values() if p.name in names]
    if task.category == "S3_fallback" and len(names) == 1:  # X was in stock: order the fallback Y instead
        request = task.user_turns[0]
        others = [p for p in catalogue().values() if p.name in request and p.sku != chosen.arguments["sku"]]
        return [*gold[:-1], _with_sku(chosen, others[0].sku)] if others else None
    other = [s for s in skus if s != chosen.arguments["sku"]]
    if task.category == "S3_fallback":  # X is out of stock: try it first, then the fallback
        return [*gold[:-1], _with_sku(chosen, other[0]), chosen] if other else None
    return [*gold[:-1], _with_sku(chosen, other[0])] if other else None


def verify_shopworld(split: str = "all", path: str | None = None, limit: int | None = None) -> VerifyReport:
    """Reward against oracle on every task of ``split`` (``limit``: the first of each split), for the
    gold and each perturbation kind; groups are kinds, counted as agreements, named with how many
    episodes the oracle passed."""
    rng = random.Random(0)
    agree: dict[str, list[int]] = {}
    failures = []
    for task in load_shopworld(split=split, limit=limit):
        for kind, calls in perturbations(task, rng).items():
            if calls is None:
                continue
            traj = Trajectory(task, [Message("user", task.user_turns[0]), Message("assistant", tool_calls=calls)])
            reward, oracle = gold_writes(task, traj).success, oracle_success(task, calls)
            counts = agree.setdefault(kind, [0, 0, 0])
            counts[0] += int(reward == oracle)
            counts[1] += 1
            counts[2] += int(oracle)
            if reward != oracle:
                failures.append({"group": kind, "id": task.id, "reason": f"{kind}: reward {reward}, oracle {oracle}: "
                                 f"{[(c.name, c.arguments) for c in calls]}"})  # fmt: skip
    report = VerifyReport(failures=failures)
    for kind, (a, t, passed) in agree.items():
        report.per_group[f"{kind} (oracle passes {passed}/{t})"] = (a, t)
        report.passed, report.total = report.passed + a, report.total + t
    return report
