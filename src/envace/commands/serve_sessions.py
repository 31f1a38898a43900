"""``envace serve-env``'s concurrency: each MCP session's state guarded on its own, and a bounded pool of
rehearsal workers, so two sessions' calls run at once and no call waits without bound.

* A :class:`Session` holds one client session's history and its own lock: its calls are answered in
  the order they arrive (each is rehearsed after the ones before), while other sessions go on.
* :class:`Sessions` holds the live sessions, bounded in count and idle time; a session it forgets is
  handed to its ``forget`` hook, which frees the keys and values the workers' engines kept for it
  (:meth:`Session.keep` notes them, :func:`free_rows` drops them).
* :class:`Pool` lends a worker (one rollout with its own engine rows, over the one shared sampling
  copy of the weights) to one call at a time. A worker's engine keeps keys and values between calls,
  which is not safe to share between threads, so a call takes a worker of its own, preferring the one
  that served its session last (whose kept rows hold the session's prefix).

Every wait is bounded (``busy_s``): a call that cannot have its session or a worker in time answers
:data:`BUSY` at once instead of queueing without end. :func:`mcp_server` is the MCP face: each
``tools/call`` finds its session by ``mcp-session-id`` and is answered in a worker thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from envace.types import ToolCall, error_observation

if TYPE_CHECKING:
    from envace.commands.serve_env import WorldModel

W = TypeVar("W")
#: a kept row's key in an engine: the token ids its keys and values cover
Key = tuple[int, ...]
#: a world model's ``answer(history, call, session)``: ``(response, is_error)``
Answer = Callable[[list[Any], Any, "Session"], tuple[Any, bool]]


def busy(what: str, seconds: float) -> dict[str, Any]:
    """The structured answer of a call that waited ``seconds`` for ``what`` in vain."""
    return error_observation("BUSY", f"no {what} free within {seconds:g} s (--busy_s); try again")


@dataclass
class Session:
    """One client session: its calls so far (``(call, tool turn)``), the lock its calls are answered
    under, the worker that answered it last (``-1``: none yet), and by worker the keys of the rows
    (keys and values) its engine kept for this session's calls (``rows``), freed when it is forgotten.

    >>> s, kept = Session(), {(1, 2): "kv"}
    >>> s.keep(0, kept, before=set()); s.rows
    {0: {(1, 2)}}
    >>> del kept[(1, 2)]; kept[(1, 2, 3)] = "kv"  # the next call extended the row: the engine kept the longer one
    >>> s.keep(0, kept, before={(1, 2)}); s.rows
    {0: {(1, 2, 3)}}
    >>> s.forgotten = True; kept[(1, 2, 3, 4)] = "kv"; s.keep(0, kept, before={(1, 2, 3)}); kept
    {}
    """

    history: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: int = -1
    rows: dict[int, set[Key]] = field(default_factory=dict)
    forgotten: bool = False  # set by Sessions: a call still in flight frees what it keeps

    def keep(self, index: int, kept: MutableMapping[Key, Any], before: set[Key]) -> None:
        """Note the rows worker ``index``'s engine now keeps (``kept``) that it did not before this
        session's call, forgetting those of this session it no longer keeps (an extended row is
        replaced by the longer one); a forgotten session's rows are freed at once."""
        mine = {key for key in self.rows.get(index, set()) | (kept.keys() - before) if key in kept}
        self.rows[index] = mine
        if self.forgotten:
            free_rows(kept, mine)

    def serve(self, answer: Answer, call: Any, busy_s: float) -> tuple[Any, bool]:
        """``answer(history, call, session)`` (``(response, is_error)``) under this session's lock (other
        sessions' calls go on meanwhile), waited for at most ``busy_s`` (else :func:`busy`): its calls
        are answered one after the other, in the order they came."""
        if not self.lock.acquire(timeout=busy_s):
            return busy("turn of this session (its earlier call is still being answered)", busy_s), True
        try:
            return answer(self.history, call, self)
        finally:
            self.lock.release()


def free_rows(kept: MutableMapping[Key, Any], keys: set[Key]) -> None:
    """Drop ``keys``'s rows from an engine's kept rows (those it still holds)."""
    for key in keys:
        kept.pop(key, None)


class Sessions:
    """The live MCP sessions, bounded: at most ``max_sessions`` (the least recently used one forgotten
    first) and none idle for more than ``idle_s`` seconds. Each session forgotten is marked so and
    handed to ``forget`` (the world model's, to free its kept rows), outside the table's lock.

    >>> s = Sessions(max_sessions=2, idle_s=60.0, clock=iter([0, 1, 2, 100]).__next__)
    >>> s.history("a").append("x"); s.history("b"); s.history("c")  # "a" is the least recently used
    []
    []
    >>> sorted(s.live), s.history("b")  # at t=100 every session has been idle for over a minute
    (['b', 'c'], [])
    >>> len(s.live)
    1
    """

    def __init__(
        self,
        max_sessions: int = 256,
        idle_s: float = 1800.0,
        clock: Any = time.monotonic,
        forget: Callable[[Session], None] = lambda session: None,
    ):
        if max_sessions < 1 or not idle_s > 0:
            raise ValueError(f"max_sessions must be >= 1 and session_idle_s > 0, got {max_sessions}, {idle_s}")
        self.max_sessions, self.idle_s, self.clock, self.forget = max_sessions, idle_s, clock, forget
        self.live: OrderedDict[str, tuple[float, Session]] = OrderedDict()
        self._lock = threading.Lock()  # held only to look a session up, never during a call

    def session(self, key: str) -> Session:
        """Session ``key`` (a new one: empty), after forgetting the idle and the least recently used."""
        gone: list[Session] = []
        with self._lock:
            now = self.clock()
            while self.live and now - next(iter(self.live.values()))[0] > self.idle_s:
                gone.append(self.live.popitem(last=False)[1][1])
            found = self.live.pop(key, (now, Session()))[1]
            self.live[key] = (now, found)
            while len(self.live) > self.max_sessions:
                gone.append(self.live.popitem(last=False)[1][1])
        for session in gone:
            session.forgotten = True
            self.forget(session)
        return found

    def history(self, key: str) -> list[Any]:
        """Session ``key``'s calls so far."""
        return self.session(key).history


class Pool(Generic[W]):
    """At most ``size`` workers, each built on first need by ``build(index)`` and lent to one caller at a time.

    >>> pool = Pool(lambda i: f"w{i}", size=2, busy_s=0.01)
    >>> with pool.lend(prefer=-1) as (i, a), pool.lend(prefer=0) as (j, b):
    ...     (i, a), (j, b), pool.take(-1)  # both lent: the third caller gets none within busy_s
    ((0, 'w0'), (1, 'w1'), None)
    >>> with pool.lend(prefer=1) as got:
    ...     got  # the one it prefers, when free
    (1, 'w1')
    """

    def __init__(self, build: Callable[[int], W], size: int = 2, busy_s: float = 30.0):
        if size < 1 or not busy_s > 0:
            raise ValueError(f"workers must be >= 1 and busy_s > 0, got {size}, {busy_s}")
        self.build, self.size, self.busy_s = build, size, busy_s
        self.workers: dict[int, W] = {}
        self.free: list[int] = []  # built and not lent
        self.pending: dict[int, list[Callable[[W], None]]] = {}  # run on a lent worker when it is given back
        self.unbuilt = list(range(size))
        self._cond = threading.Condition()

    def take(self, prefer: int) -> int | None:
        """A free worker's index (``prefer`` when it is free, else a built one, else a new one), waiting
        at most ``busy_s``; ``None`` when none came free."""
        deadline = time.monotonic() + self.busy_s
        with self._cond:
            while not self.free and not self.unbuilt:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            if self.free:
                index = prefer if prefer in self.free else self.free[0]
                self.free.remove(index)
                return index
            index = self.unbuilt.pop(0)
        try:
            self.workers[index] = self.build(index)  # outside the condition: building takes time
        except BaseException:
            with self._cond:
                self.unbuilt.insert(0, index)
                self._cond.notify()
            raise
        return index

    def give_back(self, index: int) -> None:
        with self._cond:
            for job in self.pending.pop(index, []):
                job(self.workers[index])
            self.free.append(index)
            self._cond.notify()

    def when_free(self, index: int, job: Callable[[W], None]) -> None:
        """Run ``job(worker)`` on worker ``index`` while no call holds it: now when it is free, else when it
        is given back (the worker's state is never touched by two threads at once).

        >>> pool, seen = Pool(lambda i: [], size=1), []
        >>> with pool.lend(prefer=-1) as (i, w):
        ...     pool.when_free(0, lambda w: seen.append("run"))
        ...     seen  # lent: it waits for the worker's return
        []
        >>> seen
        ['run']
        """
        with self._cond:
            if index in self.free:
                job(self.workers[index])
            elif index not in self.unbuilt:  # lent, or being built for a caller
                self.pending.setdefault(index, []).append(job)

    @contextmanager
    def lend(self, prefer: int) -> Iterator[tuple[int, W] | None]:
        """``(index, worker)`` for the block, given back after it; ``None`` when none came free in time."""
        index = self.take(prefer)
        if index is None:
            yield None
            return
        try:
            yield index, self.workers[index]
        finally:
            self.give_back(index)


def mcp_server(world: WorldModel, sessions: Sessions | None = None) -> Any:
    """The low-level SDK server answering ``tools/list`` and ``tools/call`` from ``world``
    (:class:`~envace.commands.serve_env.WorldModel`), each call in its MCP session's :class:`Session`."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    sessions = sessions or Sessions(forget=world.forget)
    listed = [types.Tool(name=t["name"], description=t.get("description") or "",
                         input_schema=t.get("parameters") or {"type": "object"}) for t in world.tools]  # fmt: skip

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: Any) -> Any:
        headers = getattr(getattr(ctx, "request", None), "headers", None)
        session = sessions.session(headers.get("mcp-session-id", "") if headers is not None else "stdio")
        call = ToolCall(params.name, dict(params.arguments or {}))
        response, failed = await anyio.to_thread.run_sync(world.serve, session, call)  # sessions in parallel
        text = json.dumps(response, ensure_ascii=False)
        structured = response if isinstance(response, dict) and not failed else None  # the JSON as text too
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=structured, is_error=failed)  # fmt: skip

    return Server("envace-world-model", on_list_tools=list_tools, on_call_tool=call_tool)
