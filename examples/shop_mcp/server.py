"""A small stateful shop as an MCP server (the official SDK's ``MCPServer``, FastMCP's name in mcp 2.x).

    python examples/shop_mcp/server.py                    # stdio: one process per client session
    python examples/shop_mcp/server.py --http 8000        # streamable HTTP on 127.0.0.1:8000/mcp

Four tools: ``search_products``, ``place_order`` (assigns an order id: ``A1001``, ``A1002``, ... in
each session), ``order_status`` and ``cancel_order`` (both need an id an earlier call returned, so a
world model of this shop has to carry ids from one response to the next call). State is kept per
MCP session: over stdio the process is the session; over HTTP each session (its ``mcp-session-id``)
has its own orders, so two clients never see each other's.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from dataclasses import dataclass, field

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError  # its message reaches the client; a plain exception's does not

CATALOG: dict[str, tuple[str, float]] = {
    "MUG-BLUE": ("blue mug", 8.5),
    "MUG-RED": ("red mug", 8.5),
    "TEA-GREEN": ("green tea, 50 bags", 6.0),
    "TEA-BLACK": ("black tea, 50 bags", 5.5),
    "KETTLE-STEEL": ("steel kettle", 34.0),
    "PLATE-WHITE": ("white plate", 4.25),
    "BOWL-OAK": ("oak bowl", 12.0),
    "SPOON-SET": ("set of six spoons", 9.75),
    "CANDLE-VAN": ("vanilla candle", 7.0),
    "TOWEL-LIN": ("linen towel", 11.5),
    "JAR-GLASS": ("glass jar", 3.8),
    "PAN-IRON": ("cast iron pan", 42.0),
}
FIRST_ORDER = 1001
MAX_SESSIONS = 4096  # HTTP: the oldest session's shop is dropped past this many

app = MCPServer("shop", instructions="A small shop: search products, place, check and cancel orders.")


@dataclass
class Shop:
    """One session's orders."""

    orders: dict[str, dict] = field(default_factory=dict)
    next_id: int = FIRST_ORDER


SHOPS: OrderedDict[str, Shop] = OrderedDict()


def shop_of(ctx: Context) -> Shop:
    """The calling session's shop (over HTTP by its ``mcp-session-id``; stdio has one session)."""
    headers = getattr(ctx.request_context.request, "headers", None)
    key = headers.get("mcp-session-id", "") if headers is not None else "stdio"
    if key not in SHOPS:
        SHOPS[key] = Shop()
        while len(SHOPS) > MAX_SESSIONS:
            SHOPS.popitem(last=False)
    return SHOPS[key]


@app.tool()
def search_products(query: str) -> dict:
    """Find products whose name or SKU contains every word of the query.

    Args:
        query: words to look for, e.g. "blue mug".
    """
    words = query.lower().split()
    found = [
        {"sku": sku, "name": name, "price": price}
        for sku, (name, price) in CATALOG.items()
        if all(w in f"{sku.lower()} {name}" for w in words)
    ]
    return {"products": found}


@app.tool()
def place_order(sku: str, quantity: int, ctx: Context) -> dict:
    """Order a quantity of one product; returns the new order with its id.

    Args:
        sku: the product's SKU, e.g. "MUG-BLUE".
        quantity: how many, 1 to 20.
    """
    if sku not in CATALOG:
        raise ToolError(f"unknown sku {sku!r}")
    if not 1 <= quantity <= 20:
        raise ToolError("quantity must be between 1 and 20")
    shop = shop_of(ctx)
    order_id = f"A{shop.next_id}"
    shop.next_id += 1
    total = round(CATALOG[sku][1] * quantity, 2)
    shop.orders[order_id] = {"order_id": order_id, "sku": sku, "quantity": quantity, "total": total, "status": "placed"}
    return dict(shop.orders[order_id])


@app.tool()
def order_status(order_id: str, ctx: Context) -> dict:
    """The current state of an order.

    Args:
        order_id: the id place_order returned, e.g. "A1001".
    """
    order = shop_of(ctx).orders.get(order_id)
    if order is None:
        raise ToolError(f"no order {order_id!r}")
    return dict(order)


@app.tool()
def cancel_order(order_id: str, ctx: Context) -> dict:
    """Cancel an order that has not shipped.

    Args:
        order_id: the id place_order returned.
    """
    order = shop_of(ctx).orders.get(order_id)
    if order is None:
        raise ToolError(f"no order {order_id!r}")
    order["status"] = "cancelled"
    return {"order_id": order_id, "status": "cancelled"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    if args.http:
        app.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        app.run()


if __name__ == "__main__":
    main()
