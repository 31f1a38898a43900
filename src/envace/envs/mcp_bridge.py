"""The bridge from the synchronous rollout to the asynchronous ``mcp`` SDK: one event loop, every wait bounded.

The rollout is synchronous (one driver thread resumes each episode's course); the official ``mcp``
SDK is asynchronous (anyio). :class:`Bridge` runs ONE event loop in a daemon thread for the whole
process, and every MCP session lives on it as one task (:class:`MCPSession`): the task opens the
transport (a stdio subprocess or a streamable-HTTP connection) and the ``ClientSession``, signals
that it is ready, and holds both open until the session is closed, so the SDK's task groups and
cancel scopes are entered and left in the same task, as anyio requires. Requests (``tools/list``,
``tools/call``) are separate tasks on the same loop; the synchronous caller waits on each for at
most its deadline (:meth:`Bridge.run`), and a request past it is cancelled.

Every way a server can fail becomes an :class:`MCPFailure` with a stable code, never a hang:

* ``SERVER_UNAVAILABLE`` — it could not be started or reached within ``connect_timeout_s``, or the
  bound on live servers (``max_live``) stayed full that long;
* ``TIMEOUT`` — a request ran past its deadline (the session is closed: its state is unknown);
* ``SERVER_CRASHED`` — the connection closed under a request (the process exited, the HTTP server went away);
* ``SERVER_GARBAGE`` — the server wrote something that is not the protocol, invalid UTF-8 included
  (the pending request fails at once, not at its deadline, quoting a bounded excerpt of what it wrote);
* ``SERVER_ERROR`` — a JSON-RPC error answer (an unknown tool, a bad request).

Live servers are bounded per server (:class:`ServerSpec.max_live`): a session takes a slot before it
starts its server and gives it back when its task has ended (the subprocess reaped). A session is
opened lazily, at the first request, so an episode that calls no tool starts no server.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import tempfile
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from envace.envs.mcp_spec import ServerSpec

T = TypeVar("T")

SERVER_UNAVAILABLE = "SERVER_UNAVAILABLE"
SERVER_CRASHED = "SERVER_CRASHED"
SERVER_GARBAGE = "SERVER_GARBAGE"
SERVER_ERROR = "SERVER_ERROR"
TIMEOUT = "TIMEOUT"
#: what the SDK's error says when the connection, not the server's answer, ended a request (stdio, HTTP)
CONNECTION_ENDED = ("closed", "stream ended without a response")
#: seconds a closing session may take to stop its server before the bridge stops waiting for it
CLOSE_TIMEOUT_S = 5.0


class MCPFailure(Exception):
    """A server failed a request; ``code`` is one of the module's stable codes."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class Bridge:
    """One asyncio event loop in a daemon thread, shared by every MCP session of the process."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._slots: dict[tuple[Any, ...], threading.BoundedSemaphore] = {}
        self.sessions: set[MCPSession] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="envace-mcp-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the future it returns can be waited on from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def run(self, coro: Awaitable[T], timeout_s: float, what: str) -> T:
        """``coro`` run on the loop and waited on for at most ``timeout_s``; past it, cancelled and
        :class:`MCPFailure` ``TIMEOUT``."""
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise MCPFailure(TIMEOUT, f"{what}: no answer within {timeout_s:g} s") from None

    def slots(self, spec: ServerSpec) -> threading.BoundedSemaphore:
        """The semaphore bounding the live servers of ``spec`` (one per server, whatever its tasks)."""
        with self._lock:
            return self._slots.setdefault((*spec.key, spec.max_live), threading.BoundedSemaphore(spec.max_live))

    def close_all(self) -> None:
        """Close every open session, waiting at most :data:`CLOSE_TIMEOUT_S` for all of them."""
        futures = [s.close() for s in list(self.sessions)]
        concurrent.futures.wait([f for f in futures if f is not None], timeout=CLOSE_TIMEOUT_S)


_BRIDGE = Bridge()
atexit.register(_BRIDGE.close_all)


def bridge() -> Bridge:
    """The process's bridge."""
    return _BRIDGE


class MCPSession:
    """One MCP client session (one server process for stdio), opened lazily, driven synchronously.

    Args:
        spec: the server and its deadlines.
        owner: the bridge whose loop runs the session (default: the process's).
    """

    def __init__(self, spec: ServerSpec, owner: Bridge | None = None):
        self.spec, self.owner = spec, owner or bridge()
        self._session: Any = None
        self._task: concurrent.futures.Future[None] | None = None
        self._closing, self._garbage = asyncio.Event(), asyncio.Event()
        self._ready = False
        self._garbage_text = ""
        self._failure: MCPFailure | None = None
        self._closed = False
        self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - lives with the session
        self._slot: threading.BoundedSemaphore | None = None
        self._slot_lock = threading.Lock()

    # --- requests ---------------------------------------------------------------------------------
    def list_tools(self) -> list[Any]:
        """Every tool the server lists (pages followed), within ``list_timeout_s``."""

        async def pages(session: Any) -> list[Any]:
            tools, cursor = [], None
            while True:
                params: Any = None if cursor is None else _paginated(cursor)
                result = await session.list_tools(params=params)
                tools.extend(result.tools)
                cursor = result.next_cursor
                if not cursor or len(tools) > 10_000:
                    return tools

        return self.request(pages, self.spec.list_timeout_s, "tools/list")

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """The server's ``CallToolResult`` of ``name(arguments)``, within ``call_timeout_s``."""
        return self.request(lambda s: s.call_tool(name, arguments), self.spec.call_timeout_s, f"tools/call {name}")

    def request(self, fn: Callable[[Any], Awaitable[T]], timeout_s: float, what: str) -> T:
        """``fn(session)`` on the loop, bounded by ``timeout_s``; any failure an :class:`MCPFailure`
        (after which the session is closed: its server's state is unknown)."""
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise MCPFailure(SERVER_UNAVAILABLE, f"{what}: the session was closed")
        self.open()
        try:
            return self.owner.run(self._guarded(fn, what), timeout_s, what)
        except MCPFailure as exc:
            raise self._fail(exc) from None

    async def _guarded(self, fn: Callable[[Any], Awaitable[T]], what: str) -> T:
        """``fn(session)``, failed at once when the server writes garbage or the session ends."""
        work = asyncio.ensure_future(fn(self._session))
        work.add_done_callback(_retrieve)  # a request abandoned for garbage still ends with an exception
        garbage = asyncio.ensure_future(self._garbage.wait())
        try:
            await asyncio.wait([work, garbage], return_when=asyncio.FIRST_COMPLETED)
        finally:
            garbage.cancel()
        if not work.done():
            work.cancel()
            raise MCPFailure(SERVER_GARBAGE, f"{what}: the server wrote non-protocol output: {self._garbage_text}")
        try:
            return work.result()
        except Exception as exc:
            raise self._classify(exc, what) from exc

    def _classify(self, exc: BaseException, what: str) -> MCPFailure:
        text = one_line(exc)
        if self._garbage.is_set():
            return MCPFailure(SERVER_GARBAGE, f"{what}: the server wrote non-protocol output: {self._garbage_text}")
        name = type(exc).__name__
        if name == "MCPError" and not any(m in text.lower() for m in CONNECTION_ENDED):
            return MCPFailure(SERVER_ERROR, f"{what}: {text}")
        return MCPFailure(SERVER_CRASHED, f"{what}: the connection ended ({text}){self._stderr_tail()}")

    # --- life cycle -------------------------------------------------------------------------------
    def open(self) -> None:
        """Start the server (or connect) and initialise the session, within ``connect_timeout_s``."""
        if self._session is not None:
            return
        spec = self.spec
        slots = self.owner.slots(spec)
        if not slots.acquire(timeout=spec.connect_timeout_s):
            raise self._fail(MCPFailure(SERVER_UNAVAILABLE, f"{spec.label}: all {spec.max_live} live servers "
                                        f"stayed busy for {spec.connect_timeout_s:g} s (max_live)"))  # fmt: skip
        self._slot = slots
        ready: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.owner.sessions.add(self)
        self._task = self.owner.submit(self._main(ready))
        self._task.add_done_callback(lambda _: self._release())  # also when cancelled before it ran
        try:
            self._session = ready.result(spec.connect_timeout_s)
        except concurrent.futures.TimeoutError:
            raise self._fail(MCPFailure(SERVER_UNAVAILABLE, f"{spec.label}: not ready within "
                                        f"{spec.connect_timeout_s:g} s{self._stderr_tail()}")) from None  # fmt: skip
        except MCPFailure as exc:
            raise self._fail(exc) from None

    async def _main(self, ready: concurrent.futures.Future[Any]) -> None:
        """The session's task: transport and ``ClientSession`` held open until :meth:`close`."""
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = ClientSession(read, write, message_handler=self._on_message)
                session = await stack.enter_async_context(session)
                await session.initialize()
                self._ready = True
                ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:  # the transport's own errors, or the cancellation of close()
            if not ready.done():
                text = one_line(exc)
                ready.set_exception(MCPFailure(SERVER_UNAVAILABLE, f"{self.spec.label}: could not start "
                                               f"({text}){self._stderr_tail()}"))  # fmt: skip
            if not isinstance(exc, Exception | asyncio.CancelledError):
                raise
        finally:
            self._release()

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        spec = self.spec
        if spec.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(spec.url)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=spec.command or "", args=list(spec.args), env=dict(spec.env) or None,
                                       cwd=spec.cwd, encoding_error_handler="replace")  # fmt: skip
        # "replace": a bad byte makes its line unparseable, which the SDK hands to _on_message at once;
        # "strict" would end the reader silently and leave the request to its deadline
        return stdio_client(params, errlog=self._errlog)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self._garbage_text = garbage_excerpt(message)
            self._garbage.set()

    def close(self) -> concurrent.futures.Future[None] | None:
        """End the session and stop its server (in the background; the slot is freed when it has)."""
        closing, task = self._closing, self._task
        self._session, self._closed = None, True
        if task is not None and not task.done():
            if self._ready:
                self.owner.loop.call_soon_threadsafe(closing.set)
            else:  # still starting: stop it where it is
                task.cancel()
            return task
        self._release()
        return None

    def _fail(self, exc: MCPFailure) -> MCPFailure:
        """Remember the first failure (every later request answers it) and close the session."""
        if self._failure is None:
            self._failure = exc
        self.close()
        return self._failure

    def _release(self) -> None:
        with self._slot_lock:
            slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()
        self.owner.sessions.discard(self)

    def _stderr_tail(self, lines: int = 3) -> str:
        """`` (stderr: <its last lines, joined by | >)`` when the server wrote to stderr, else nothing."""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            written = [line.strip() for line in self._errlog.read()[-4000:].splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return f" (stderr: {' | '.join(w[:200] for w in written[-lines:])})" if written else ""


def one_line(exc: BaseException) -> str:
    """``exc`` as one short line, an exception group by its first leaf (what actually went wrong).

    >>> one_line(ExceptionGroup("unhandled errors", [ConnectionError("refused")]))
    'ConnectionError: refused'
    """
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def garbage_excerpt(exc: Exception, limit: int = 120) -> str:
    """What a server wrote that is not the protocol, quoted (at most ``limit`` characters), and why.

    >>> from mcp import types
    >>> try:
    ...     types.jsonrpc_message_adapter.validate_json("caf\ufffd is not json", by_name=False)
    ... except ValueError as exc:
    ...     print(garbage_excerpt(exc))
    'caf\ufffd is not json' (Invalid JSON: expected value at line 1 column 1)
    """
    errors = getattr(exc, "errors", None)
    try:
        first = errors()[0] if callable(errors) else None
    except Exception:  # not pydantic's: its one line says what there is
        first = None
    if not isinstance(first, dict) or "input" not in first:
        return one_line(exc)[:200]
    written = first["input"] if isinstance(first["input"], str) else repr(first["input"])
    quoted = repr(written[:limit]) + ("..." if len(written) > limit else "")
    return f"{quoted} ({str(first.get('msg', 'not JSON-RPC'))[:100]})"


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _paginated(cursor: str) -> Any:
    import mcp_types

    return mcp_types.PaginatedRequestParams(cursor=cursor)
