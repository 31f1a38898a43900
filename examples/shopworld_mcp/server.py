"""ShopWorld (docs/shopworld.md) as an MCP server (the official SDK's ``MCPServer``, FastMCP's name in mcp 2.x).

    python examples/shopworld_mcp/server.py                                        # a world with no orders
    python examples/shopworld_mcp/server.py --orders '[{"order_id": "B12345", "sku": "K7Q2", "quantity": 2}]'

Over stdio, one process per client session: the process is one episode's shop. Its tools are
:mod:`envace.envs.shopworld`'s, called, not copied: the same five names, listed with the schemas
envace builds for the in-process class (name, description, parameters; no output schema), and each
call answers what the in-process method answers, the world's own errors included (``{"error":
"UNKNOWN_SKU", ...}``, as a real shop's API gives them). Arguments that do not fit a tool's
signature are the SDK's ``ToolError`` (``isError``), never a crash.

The task's hidden state comes from the command line, never from the model: ``--orders`` is
``ShopWorld.reset``'s ``orders`` (the orders that exist before the episode, S5_control's), as a task
row's ``metadata`` holds them; ``examples/shopworld_mcp/source.py`` adds it to each such task's
server command. The tool list is the same whatever the orders, so listing it once is enough.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool

from envace.data.sources.shopworld import ENV
from envace.envs.pytools import python_tools
from envace.envs.shopworld import ShopWorld


def world_tools(world: ShopWorld) -> list[Tool]:
    """``world``'s bound methods as SDK tools, listed in the order and with the schemas envace gives the
    in-process class (:func:`envace.envs.pytools.python_tools`); their answers are sent as JSON text,
    so no output schema is listed (the in-process block has none)."""
    tools = []
    for schema in python_tools(ENV):
        fn = getattr(world, schema["name"])
        tool = Tool.from_function(fn, name=schema["name"], description=schema["description"], structured_output=False)
        tools.append(tool.model_copy(update={"parameters": schema["parameters"]}))
    return tools


def parse_orders(text: str) -> list[dict[str, Any]]:
    """``--orders``: a JSON list of ``{order_id, sku, quantity}`` objects; anything else a one-line error.

    >>> parse_orders('[{"order_id": "B1", "sku": "K7Q2", "quantity": 2}]')
    [{'order_id': 'B1', 'sku': 'K7Q2', 'quantity': 2}]
    >>> parse_orders('[{"order_id": "B1"}]')
    Traceback (most recent call last):
    ValueError: --orders: each order is {"order_id": str, "sku": str, "quantity": int}, got {'order_id': 'B1'}
    """
    try:
        orders = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--orders: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(orders, list):
        raise ValueError(f"--orders: a JSON list of orders, got {type(orders).__name__}")
    for order in orders:
        if not _is_order(order):
            raise ValueError(f'--orders: each order is {{"order_id": str, "sku": str, "quantity": int}}, got {order!r}')
    return orders


def _is_order(order: Any) -> bool:
    if not isinstance(order, dict) or set(order) != {"order_id", "sku", "quantity"}:
        return False
    return isinstance(order["order_id"], str) and isinstance(order["sku"], str) and type(order["quantity"]) is int


def make_app(orders: list[dict[str, Any]] | None = None) -> MCPServer:
    """The server of one episode's shop, which starts with ``orders``."""
    world = ShopWorld()
    world.reset(orders=orders)
    about = "A shop: search products, place, check, cancel and list orders."
    return MCPServer("shopworld", instructions=about, tools=world_tools(world))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", default="[]", help="the orders that exist before the episode (JSON list)")
    args = parser.parse_args()
    try:
        orders = parse_orders(args.orders)
    except ValueError as exc:
        parser.error(str(exc))
    make_app(orders).run()


if __name__ == "__main__":
    main()
