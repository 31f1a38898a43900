"""ShopWorld's tasks (source ``shopworld``): procedurally drawn, in five strata of equal shares.

Each task is one user turn in the world of :mod:`envace.envs.shopworld`; its gold is the oracle's
course (the reads it needs, then the writes). Strata, cycling within each split:

* ``S1_copy`` — order a product named in words: the SKU is only in ``search_products``' answer;
* ``S2_cheaper`` — order the cheaper of two named products: the prices are only in the answers;
* ``S3_fallback`` — order X, or Y if X is out of stock (X is out of stock in half of them);
* ``S4_carry`` — order, then check or cancel that order: the id ``place_order`` answers is reused;
* ``S5_control`` — cancel one of the customer's existing orders: the orders, and their ids, are
  hidden state drawn per task (``list_orders`` shows them), which **no world model can know**. An
  arm that never sees a real answer cannot learn it; one that gains here reads answers it was not
  given, or the reward leaks.

A task's id names its split, index, stratum and, for held-out products, ``-heldout``
(``shopworld-test-0004-S5_control``), so a study's filters can select strata by id (``*S[1-4]_*``).

Splits (i.i.d. draws, disjoint by request and gold): ``sft`` 512 (the warm start's gold episodes),
``rl`` 2,000 (each seen about once), ``tune`` 200 (recipe and difficulty choices), ``test`` 500 (the
verdicts; half of its S1–S3 tasks ask for held-out products, which no other split shows). A split's
tasks are the same in every process. The reward is ``gold-writes``
(:func:`~envace.rewards.gold.gold_writes`): the writes and the task's required reads, in order.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable
from functools import cache
from typing import Any

from envace.envs.pytools import python_tools
from envace.envs.shopworld import WRITE_TOOLS, Product, catalogue
from envace.types import Task, ToolCall

ENV = {"kind": "python", "class": "envace.envs.shopworld:ShopWorld"}
SPLITS = {"sft": 512, "rl": 2000, "tune": 200, "test": 500}
ORDER = ("test", "tune", "rl", "sft")  # drawn in this order; a later split skips what an earlier one holds
STRATA = ("S1_copy", "S2_cheaper", "S3_fallback", "S4_carry", "S5_control")
SYSTEM = ("You are the shop's assistant. Use the tools to do what the customer asks. Copy SKUs and order ids "
          "exactly as the tools return them, and order only what the customer asks for.")  # fmt: skip

Draw = tuple[str, list[ToolCall], dict[str, Any]]  # request, gold calls, metadata (reset kwargs and more)


def _search(p: Product) -> ToolCall:
    return ToolCall("search_products", {"query": p.name})


def _order(p: Product, q: int) -> ToolCall:
    return ToolCall("place_order", {"sku": p.sku, "quantity": q})


def _copy(rng: random.Random, pool: list[Product]) -> Draw:
    p, q = rng.choice([p for p in pool if p.in_stock]), rng.randint(1, 5)
    ask = rng.choice(["Please order {q} of the {n}.", "I'd like {q} x {n}.", "Buy {q} of the {n} for me."])
    return ask.format(q=q, n=p.name), [_search(p), _order(p, q)], {}


def _cheaper(rng: random.Random, pool: list[Product]) -> Draw:
    a, b = rng.sample([p for p in pool if p.in_stock], 2)
    q, best = rng.randint(1, 5), min((a, b), key=lambda p: p.price)
    ask = rng.choice(["Order {q} of whichever is cheaper: the {a} or the {b}.",
                      "Between the {a} and the {b}, buy {q} of the cheaper one."])  # fmt: skip
    return ask.format(q=q, a=a.name, b=b.name), [_search(a), _search(b), _order(best, q)], {}


def _fallback(rng: random.Random, pool: list[Product]) -> Draw:
    out = rng.random() < 0.5  # drawn per task: half the tasks need the fallback
    x = rng.choice([p for p in pool if p.in_stock != out])
    y = rng.choice([p for p in pool if p.in_stock and p != x])
    q = rng.randint(1, 5)
    ask = rng.choice(["Order {q} of the {x}; if it is out of stock, order the {y} instead.",
                      "Buy {q} x {x}, or {q} x {y} if the first is out of stock."])  # fmt: skip
    gold = [_search(x), _search(y), _order(y, q)] if out else [_search(x), _order(x, q)]
    return ask.format(q=q, x=x.name, y=y.name), gold, {}


def _carry(rng: random.Random, pool: list[Product]) -> Draw:
    p, q = rng.choice([p for p in pool if p.in_stock]), rng.randint(1, 5)
    then = rng.choice(["order_status", "cancel_order"])
    what = "tell me that order's status" if then == "order_status" else "cancel that order"
    ask = rng.choice(["Order {q} of the {n}, then {w}.", "Buy {q} x {n} and {w}."]).format(q=q, n=p.name, w=what)
    gold = [_search(p), _order(p, q), ToolCall(then, {"order_id": "A1001"})]
    return ask, gold, {"required_reads": ["order_status"] if then == "order_status" else []}


def _control(rng: random.Random, pool: list[Product]) -> Draw:
    products = rng.sample(pool, rng.randint(2, 3))
    orders = [{"order_id": f"B{rng.randint(10000, 99999)}", "sku": p.sku, "quantity": rng.randint(1, 5)}
              for p in products]  # fmt: skip
    target = rng.choice(orders)
    name = catalogue()[str(target["sku"])].name
    ask = rng.choice(["Please cancel my order of the {n}.", "I no longer want the {n} I ordered: cancel it."])
    gold = [ToolCall("list_orders", {}), ToolCall("cancel_order", {"order_id": target["order_id"]})]
    return ask.format(n=name), gold, {"orders": orders}


DRAWS: dict[str, Callable[[random.Random, list[Product]], Draw]] = dict(
    zip(STRATA, (_copy, _cheaper, _fallback, _carry, _control), strict=True)
)


def _pool(split: str, stratum: str, k: int) -> list[Product]:
    """Test's S1–S3 draw held-out products every other cycle; every other task, any split, never does."""
    held = split == "test" and stratum in STRATA[:3] and (k // len(STRATA)) % 2 == 0
    return [p for p in catalogue().values() if p.held_out == held]


def _key(draw: Draw) -> str:
    return draw[0] + "|" + "|".join(f"{c.name}{sorted(c.arguments.items())}" for c in draw[1])


def draw_split(split: str, n: int, taken: set[str]) -> list[Task]:
    """The first ``n`` tasks of ``split``, none whose request and gold ``taken`` holds (``taken`` grows)."""
    rng = random.Random(f"shopworld/{split}")
    tools = python_tools(ENV)
    tasks: list[Task] = []
    while len(tasks) < n:
        k = len(tasks)
        stratum = STRATA[k % len(STRATA)]
        draw = DRAWS[stratum](rng, _pool(split, stratum, k))
        if _key(draw) in taken:
            continue
        taken.add(_key(draw))
        request, gold, meta = draw
        held = any(catalogue()[str(c.arguments.get("sku", ""))].held_out for c in gold if "sku" in c.arguments)
        scored = sorted({*WRITE_TOOLS, *meta.pop("required_reads", [])})
        name = f"shopworld-{split}-{k:04d}-{stratum}" + ("-heldout" if held else "")  # filters match ids
        tasks.append(Task(id=name, benchmark="shopworld", category=stratum,
                          system_prompt=SYSTEM, tools=tools, user_turns=[request], gold=[gold], env=dict(ENV),
                          extra={"metadata": meta, "scored_tools": scored, "held_out": held,
                                 "split": split}))  # fmt: skip
    return tasks


def _off_gold(rng: random.Random, next_gold: ToolCall | None) -> ToolCall:
    """One valid call a policy might make instead of the gold's next, errors included; it names no
    held-out product (their SKUs and names stay out of every training artefact)."""
    seen = [p for p in catalogue().values() if not p.held_out]
    while True:
        kind = rng.choice(["search", "search_pair", "order", "order_bad", "status", "cancel", "list"])
        p, q = rng.choice(seen), rng.randint(1, 5)
        oid = rng.choice(["A1001", "A1002", f"B{rng.randint(10000, 99999)}"])
        call = {
            "search": ToolCall("search_products", {"query": p.name}),
            "search_pair": ToolCall("search_products", {"query": f"{p.colour} {p.kind}"}),
            "order": ToolCall("place_order", {"sku": p.sku, "quantity": q}),
            "order_bad": ToolCall("place_order", rng.choice([{"sku": p.sku, "quantity": rng.choice([0, 12])},
                                                              {"sku": "Z0Z0", "quantity": q}])),
            "status": ToolCall("order_status", {"order_id": oid}),
            "cancel": ToolCall("cancel_order", {"order_id": oid}),
            "list": ToolCall("list_orders", {}),
        }[kind]  # fmt: skip
        if call != next_gold:
            return call


def exploration(n: int) -> list[Task]:
    """``n`` rehearse-only transitions (the fidelity knob E, docs/shopworld.md): a gold prefix of an
    ``sft`` or ``rl`` task, then one off-gold call; grounded in the real world they train the rehearse
    role only (``extra["rehearse_only"]``: the acts are context). Each costs ``extra["env_calls"]``
    real calls (its prefix and the call), counted against the arm that uses them."""
    rng = random.Random("shopworld/explore")
    drawn = _all_splits()
    bases = [*drawn["sft"], *drawn["rl"]]
    tasks = []
    for i in range(n):
        base = rng.choice(bases)
        gold = base.gold[0]
        cut = rng.randrange(len(gold))
        calls = [*gold[:cut], _off_gold(rng, gold[cut])]
        extra = {**copy.deepcopy(base.extra), "rehearse_only": True, "split": "explore", "env_calls": len(calls)}
        tasks.append(dataclasses.replace(copy.deepcopy(base), id=f"shopworld-explore-{i:05d}", gold=[calls],
                                         extra=extra))  # fmt: skip
    return tasks


def load_shopworld(split: str = "all", path: str | None = None, limit: int | None = None) -> list[Task]:
    """The tasks of ``split`` (``sft``, ``rl``, ``tune``, ``test``; ``train`` = ``sft``; ``all``); ``limit``:
    the first ``limit`` of each split (strata stay balanced). ``path`` is unused: the world is code.
    ``explore``: :func:`exploration` transitions (``limit`` of them, default 1,600), not part of ``all``."""
    if split == "explore":
        return exploration(1600 if limit is None else limit)
    wanted = {"train": "sft"}.get(split, split)
    if wanted != "all" and wanted not in SPLITS:
        raise ValueError(f"shopworld: unknown split {split!r}; splits: {', '.join(SPLITS)}, train, all")
    drawn = _all_splits()
    return [copy.deepcopy(t) for name in ORDER if wanted in ("all", name) for t in drawn[name][:limit]]


@cache
def _all_splits() -> dict[str, tuple[Task, ...]]:
    """Every split, drawn once per process (disjointness needs the earlier ones drawn first)."""
    taken: set[str] = set()
    return {name: tuple(draw_split(name, SPLITS[name], taken)) for name in ORDER}
