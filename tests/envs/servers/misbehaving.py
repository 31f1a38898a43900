"""An MCP server for the tests (stdio, or streamable HTTP on 127.0.0.1), misbehaving as its mode says.

    python misbehaving.py MODE [PORT]

MODE: ``good`` (a counter kept per MCP session), ``crash`` (exits on the first call), ``hang``
(a call never answers), ``slow`` (a call takes 1.5 s), ``garbage`` (a call writes non-protocol
bytes to stdout), ``bad_utf8`` (a call writes bytes that are not UTF-8), ``slow_start`` (sleeps 60 s
before serving), ``die_at_start`` (writes three lines to stderr and exits 1), ``crash_later`` (serves
four calls, then exits on the fifth: a server that dies mid-warm-start).
"""

import os
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

MODE = sys.argv[1]
app = MCPServer("misbehaving")
counters: dict[str, list[int]] = {}
calls = [0]


def session_key(ctx: Context) -> str:
    """The MCP session of the request: its ``mcp-session-id`` header over HTTP; stdio is one process, one session."""
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return headers.get("mcp-session-id", "") if headers is not None else "stdio"


@app.tool()
def bump(ctx: Context, by: int = 1) -> dict:
    """Add `by` to this session's counter and return it.

    Args:
        by: how much to add.
    """
    calls[0] += 1
    if MODE == "crash" or (MODE == "crash_later" and calls[0] > 4):
        os._exit(3)
    if MODE == "hang":
        time.sleep(3600)
    if MODE == "slow":
        time.sleep(1.5)
    if MODE in ("garbage", "bad_utf8"):  # the SDK diverts fd 1 to stderr and serves the wire from a private copy
        from mcp.server import stdio

        claim = stdio._claims.get(1)
        written = b"this is not json-rpc\n" if MODE == "garbage" else b"\xff\xfe not utf-8 \xc3\n"
        os.write(claim.private_fd if claim and claim.private_fd else 1, written)
        time.sleep(3600)
    counter = counters.setdefault(session_key(ctx), [0])
    counter[0] += by
    return {"counter": counter[0]}


@app.tool()
def fail(reason: str) -> str:
    """Always raise (an isError result).

    Args:
        reason: the message.
    """
    raise ValueError(reason)


if __name__ == "__main__":
    if MODE == "slow_start":
        time.sleep(60)
    if MODE == "die_at_start":
        print("starting the loans service\nopening loans.sqlite\nRuntimeError: no database", file=sys.stderr)
        sys.exit(1)
    if len(sys.argv) > 2:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
