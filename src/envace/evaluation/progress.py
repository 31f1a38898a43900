"""Progress of long work as plain lines on stderr: items done, rate and time left, and a heartbeat.

``envace evaluate`` writes one :class:`Progress` per imagination setting and ``envace show`` one for
its episode. A line goes out when an item finishes (at most one every ``every`` seconds, and
always for the last), and a heartbeat thread writes the same line when nothing was written for
``every`` seconds, so a batch that generates for minutes is never silent::

    evaluate bfcl parallel n=2 [2/5]: 12/48 items, 0.80 item/s, eta 45s
    evaluate bfcl parallel n=2 [2/5]: 12/48 items, 0.80 item/s, eta 45s; 1m02s, 3,140 tokens (51 tok/s)

Lines end with a newline (never a carriage return), so a pipe or a log file reads them as they come.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO


def duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``1h02m``.

    >>> duration(44.6), duration(192), duration(3725)
    ('45s', '3m12s', '1h02m')
    """
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Progress of ``total`` items of work named ``label`` (a context manager: the heartbeat runs inside).

    Args:
        label: what is running (``evaluate bfcl parallel n=2 [2/5]``).
        total: items to do.
        every: seconds between lines at most (items) and at least (heartbeat); ``0``: no heartbeat.
        stream: where lines go (default: the current ``sys.stderr``).
        unit: the items' name in the line (plural).
        quiet: write nothing (the counts still count).
    """

    def __init__(self, label: str, total: int, every: float = 5.0, stream: IO[str] | None = None,
                 unit: str = "items", quiet: bool = False) -> None:  # fmt: skip
        self.label, self.total, self.every, self.unit = label, total, every, unit
        self.stream, self.quiet = stream, quiet
        self.done = 0
        self.lines = 0
        self._token_sources: list[Callable[[], int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = self._last = time.monotonic()

    # --- what is counted ----------------------------------------------------------------------------
    def track_tokens(self, source: Callable[[], int]) -> None:
        """Add a running count of generated tokens (an engine's ``stats.tokens``) to the heartbeat."""
        self._token_sources.append(source)

    def advance(self, k: int = 1) -> None:
        """``k`` more items are done; writes a line when ``every`` seconds passed or all are done."""
        with self._lock:
            self.done += k
            if self.done >= self.total or time.monotonic() - self._last >= self.every:
                self._write(self.line())

    def note(self, text: str) -> None:
        """Write ``label: text`` now (a phase the items do not count)."""
        with self._lock:
            self._write(f"{self.label}: {text}")

    # --- the line ------------------------------------------------------------------------------------
    def line(self, heartbeat: bool = False) -> str:
        elapsed = time.monotonic() - self._began
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = duration((self.total - self.done) / rate) if rate > 0 else "?"
        speed = f"{rate:.0f}" if rate >= 10 else f"{rate:.2f}"
        text = f"{self.label}: {self.done}/{self.total} {self.unit}, {speed} {self.unit.rstrip('s')}/s, eta {eta}"
        if heartbeat:
            text += f"; {duration(elapsed)}"
            if self._token_sources:
                tokens = sum(source() for source in self._token_sources)
                text += f", {tokens:,} tokens ({tokens / elapsed:.0f} tok/s)"
        return text

    def _write(self, text: str) -> None:
        self._last = time.monotonic()
        self.lines += 1
        if not self.quiet:
            print(text, file=self.stream or sys.stderr, flush=True)

    # --- the heartbeat -------------------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.wait(self.every / 4):
            with self._lock:
                if time.monotonic() - self._last >= self.every:
                    self._write(self.line(heartbeat=True))

    def __enter__(self) -> Progress:
        self._began = self._last = time.monotonic()
        if self.every > 0 and not self.quiet:
            self._thread = threading.Thread(target=self._beat, name=f"progress: {self.label}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, self.every))
