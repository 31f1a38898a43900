"""``envace serve-env``'s concurrency: each MCP session's state guarded on its own, and a bounded pool of
rehearsal workers, so two sessions' calls run at once and no call waits without bound.

* A :class:`Session` holds one client session's history and its own lock: its calls are answered in
  the order they arrive (each is rehearsed after the ones before), while other sessions go on.
* :class:`Sessions` holds the live sessions, bounded in count and idle time.
* :class:`Pool` lends a worker (one rollout with its own engine rows, over the one shared sampling
  copy of the weights) to one call at a time. A worker's engine keeps keys and values between calls,
  which is not safe to share between threads, so a call takes a worker of its own, preferring the one
  that served its session last (whose kept rows hold the session's prefix).

Every wait is bounded (``busy_s``): a call that cannot have its session or a worker in time answers
:data:`BUSY` at once instead of queueing without end.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from envace.types import error_observation

W = TypeVar("W")


def busy(what: str, seconds: float) -> dict[str, Any]:
    """The structured answer of a call that waited ``seconds`` for ``what`` in vain."""
    return error_observation("BUSY", f"no {what} free within {seconds:g} s (--busy_s); try again")


@dataclass
class Session:
    """One client session: its calls so far (``(call, tool turn)``), the lock its calls are answered
    under, and the worker that answered it last (``-1``: none yet)."""

    history: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: int = -1


class Sessions:
    """The live MCP sessions, bounded: at most ``max_sessions`` (the least recently used one forgotten
    first) and none idle for more than ``idle_s`` seconds.

    >>> s = Sessions(max_sessions=2, idle_s=60.0, clock=iter([0, 1, 2, 100]).__next__)
    >>> s.history("a").append("x"); s.history("b"); s.history("c")  # "a" is the least recently used
    []
    []
    >>> sorted(s.live), s.history("b")  # at t=100 every session has been idle for over a minute
    (['b', 'c'], [])
    >>> len(s.live)
    1
    """

    def __init__(self, max_sessions: int = 256, idle_s: float = 1800.0, clock: Any = time.monotonic):
        if max_sessions < 1 or not idle_s > 0:
            raise ValueError(f"max_sessions must be >= 1 and session_idle_s > 0, got {max_sessions}, {idle_s}")
        self.max_sessions, self.idle_s, self.clock = max_sessions, idle_s, clock
        self.live: OrderedDict[str, tuple[float, Session]] = OrderedDict()
        self._lock = threading.Lock()  # held only to look a session up, never during a call

    def session(self, key: str) -> Session:
        """Session ``key`` (a new one: empty), after forgetting the idle and the least recently used."""
        with self._lock:
            now = self.clock()
            while self.live and now - next(iter(self.live.values()))[0] > self.idle_s:
                self.live.popitem(last=False)
            found = self.live.pop(key, (now, Session()))[1]
            self.live[key] = (now, found)
            while len(self.live) > self.max_sessions:
                self.live.popitem(last=False)
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
            self.free.append(index)
            self._cond.notify()

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
