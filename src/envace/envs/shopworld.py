"""ShopWorld: a procedural, stateful shop whose tasks can only be solved by reading what its tools answer.

The world's facts are fixed and learnable: a catalogue of :data:`N_PRODUCTS` products (6 kinds × 5
colours × 4 styles), each with an arbitrary 4-character SKU, a price and an in-stock flag, drawn once
from :data:`WORLD_SEED`. One colour of each kind (24 products) is **held out**: no training artefact
shows it, and only test tasks ask for it, so an act that passes them copied a SKU a tool returned.

:class:`ShopWorld` is a TRL-shaped class (``env: {kind: python, class: envace.envs.shopworld:ShopWorld}``,
docs/own-tools.md): one instance per episode, ``reset(**metadata)`` sets the task's hidden state (the
orders that exist before the episode: random per task, what no world model can know), its public
methods are the tools. A call takes microseconds. Errors are answers (``{"error": CODE, ...}``), as a
real shop's API would give them. Tasks and their strata: :mod:`envace.data.sources.shopworld`;
the reward: :func:`envace.rewards.gold.gold_writes`; the state-replay oracle: :func:`final_state`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from typing import Any

KINDS = ("mug", "lamp", "scarf", "kettle", "backpack", "notebook")
COLOURS = ("red", "blue", "green", "black", "white")
STYLES = ("classic", "modern", "rustic", "compact")
HELD_OUT_COLOUR = {kind: COLOURS[i % len(COLOURS)] for i, kind in enumerate(KINDS)}  # one colour a kind
WORLD_SEED = 20261207
N_PRODUCTS = len(KINDS) * len(COLOURS) * len(STYLES)
SKU_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: a copied SKU is unambiguous
MAX_RESULTS = 4  # search results per call: the distractor knob (m)
FIRST_ORDER = 1001
TOOLS = ("search_products", "place_order", "order_status", "cancel_order", "list_orders")
WRITE_TOOLS = ("place_order", "cancel_order")


@dataclass(frozen=True)
class Product:
    sku: str
    kind: str
    colour: str
    style: str
    price: float
    in_stock: bool

    @property
    def name(self) -> str:
        return f"{self.colour} {self.style} {self.kind}"

    @property
    def held_out(self) -> bool:
        return HELD_OUT_COLOUR[self.kind] == self.colour

    def listing(self) -> dict[str, Any]:
        return {"sku": self.sku, "name": self.name, "price": self.price, "in_stock": self.in_stock}


@cache
def catalogue() -> dict[str, Product]:
    """The world's products by SKU, the same in every process (drawn from :data:`WORLD_SEED`).

    >>> c = catalogue()
    >>> len(c), sum(p.held_out for p in c.values())
    (120, 24)
    """
    rng = random.Random(WORLD_SEED)
    products: dict[str, Product] = {}
    for kind in KINDS:
        for colour in COLOURS:
            for style in STYLES:
                sku = "".join(rng.choice(SKU_ALPHABET) for _ in range(4))
                while sku in products:
                    sku = "".join(rng.choice(SKU_ALPHABET) for _ in range(4))
                price = round(rng.uniform(4.0, 95.0), 2)
                products[sku] = Product(sku, kind, colour, style, price, rng.random() >= 0.3)
    return products


def by_name(name: str) -> Product:
    """The product called ``name`` (``"red classic mug"``)."""
    found = [p for p in catalogue().values() if p.name == name]
    if not found:
        raise KeyError(name)
    return found[0]


def search(query: str, limit: int = MAX_RESULTS) -> list[Product]:
    """Products of the kind and the colour the query names (each, when it names one), ranked by how
    many of the query's words their name holds (ties: by name): a full name comes first, then the
    same kind in that colour in other styles (the distractors). A held-out product therefore only
    answers a query that names its kind and its colour, which only test tasks do.

    >>> [p.name for p in search("red classic mug")]
    ['red classic mug', 'red compact mug', 'red modern mug', 'red rustic mug']
    """
    words = set(query.lower().split())
    kinds, colours = words & set(KINDS), words & set(COLOURS)
    matching = [p for p in catalogue().values()
                if (not kinds or p.kind in kinds) and (not colours or p.colour in colours)]  # fmt: skip
    scored = [(len(words & set(p.name.split())), p) for p in matching]
    ranked = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1].name))
    return [p for _, p in ranked[:limit]]


class ShopWorld:
    """One episode's shop (TRL's ``environment_factory`` shape: see the module docstring)."""

    def __init__(self) -> None:
        self.orders: dict[str, dict[str, Any]] = {}
        self.next_id = FIRST_ORDER

    def reset(self, orders: list[dict[str, Any]] | None = None, **_: Any) -> None:
        """Start the episode with the task's pre-existing ``orders`` (``[{order_id, sku, quantity}]``)."""
        self.orders, self.next_id = {}, FIRST_ORDER
        for o in orders or []:
            self.orders[str(o["order_id"])] = {"sku": str(o["sku"]), "quantity": int(o["quantity"]), "status": "placed"}

    def search_products(self, query: str) -> dict[str, Any]:
        """Search the catalogue by words of a product's name.

        Args:
            query: words of the product's name, such as a colour, a style and a kind.
        """
        return {"results": [p.listing() for p in search(query)]}

    def place_order(self, sku: str, quantity: int) -> dict[str, Any]:
        """Order a product.

        Args:
            sku: the product's SKU, as search_products returns it.
            quantity: how many to order (1 to 9).
        """
        product = catalogue().get(sku)
        if product is None:
            return {"error": "UNKNOWN_SKU", "sku": sku}
        if not 1 <= quantity <= 9:
            return {"error": "INVALID_QUANTITY", "quantity": quantity}
        if not product.in_stock:
            return {"error": "OUT_OF_STOCK", "sku": sku}
        order_id = f"A{self.next_id}"
        self.next_id += 1
        self.orders[order_id] = {"sku": sku, "quantity": quantity, "status": "placed"}
        return {"order_id": order_id, "sku": sku, "quantity": quantity, "total": round(product.price * quantity, 2)}

    def order_status(self, order_id: str) -> dict[str, Any]:
        """The status of an order.

        Args:
            order_id: the order's id, as place_order or list_orders returns it.
        """
        order = self.orders.get(order_id)
        if order is None:
            return {"error": "UNKNOWN_ORDER", "order_id": order_id}
        return {"order_id": order_id, **order}

    def cancel_order(self, order_id: str) -> dict[str, Any]:
        """Cancel an order that is still placed.

        Args:
            order_id: the order's id, as place_order or list_orders returns it.
        """
        order = self.orders.get(order_id)
        if order is None:
            return {"error": "UNKNOWN_ORDER", "order_id": order_id}
        if order["status"] != "placed":
            return {"error": "NOT_CANCELLABLE", "order_id": order_id, "status": order["status"]}
        order["status"] = "cancelled"
        return {"order_id": order_id, "status": "cancelled"}

    def list_orders(self) -> dict[str, Any]:
        """The customer's orders, newest last."""
        return {"orders": [{"order_id": k, **v} for k, v in self.orders.items()]}


def final_state(calls: list[tuple[str, dict[str, Any]]], orders: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The state-replay oracle's view of an episode: its calls run, in order, in a fresh world that
    starts with ``orders``; returns the order book it leaves, the reads that answered without an
    error (``name``, arguments) and the writes that were refused. Independent of any reward: it
    reads the world, not the gold.

    >>> s = final_state([("place_order", {"sku": "nope", "quantity": 1})])
    >>> s["book"], s["refused_writes"]
    ({}, 1)
    """
    world = ShopWorld()
    world.reset(orders=orders)
    reads, refused = [], 0
    for name, args in calls:
        fn = getattr(world, name, None) if name in TOOLS else None
        try:
            answer = fn(**args) if fn is not None else {"error": "UNKNOWN_TOOL"}
        except TypeError:  # arguments that do not fit the tool
            answer = {"error": "INVALID_ARGUMENTS"}
        if name in WRITE_TOOLS and "error" in answer:
            refused += 1
        elif name not in WRITE_TOOLS and "error" not in answer:
            reads.append((name, dict(sorted(args.items()))))
    return {"book": world.orders, "reads": reads, "refused_writes": refused}
