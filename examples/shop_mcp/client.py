"""Call a shop over MCP with the SDK's own client: the real server or `envace serve-env`'s learned one.

    python examples/shop_mcp/client.py http://127.0.0.1:8000/mcp      # the real shop (server.py --http 8000)
    python examples/shop_mcp/client.py http://127.0.0.1:8001/mcp      # envace serve-env --port 8001

Lists the tools, places an order, then asks for the status of the order id the first answer gave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


def text(result) -> str:
    """A result's text on one line (JSON re-dumped compactly), ``isError`` first when it is one."""
    body = " ".join(getattr(b, "text", "") for b in result.content)
    with contextlib.suppress(ValueError):
        body = json.dumps(json.loads(body))
    return ("isError " if result.is_error else "") + body


async def main(url: str) -> None:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        print("tools:", ", ".join(t.name for t in tools.tools))
        placed = await session.call_tool("place_order", {"sku": "MUG-BLUE", "quantity": 2})
        print("place_order(MUG-BLUE, 2) ->", text(placed))
        try:
            order_id = json.loads(placed.content[0].text)["order_id"]
        except (ValueError, KeyError, IndexError, TypeError):
            order_id = "A1001"
        status = await session.call_tool("order_status", {"order_id": order_id})
        print(f"order_status({order_id}) ->", text(status))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/mcp"))
