"""The judge's transport: one POST to an untrusted endpoint that ends by a deadline, whatever the
endpoint does (hangs, trickles bytes, cuts a body short, breaks the status line, sends a body that is
not UTF-8 or not JSON), and a kind for every way it can fail (:func:`failure_kind`, the kinds worth
retrying in :data:`RETRIED`). Standard library only; :mod:`envace.rewards.judge` builds on it."""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
import urllib.error
import urllib.request
from functools import partial
from typing import Any, cast

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
#: the kind of a failed attempt (:func:`failure_kind`), first match wins
KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (TimeoutError, "timeout"),  # a read, send or connect past the deadline
    (http.client.HTTPException, "protocol"),  # BadStatusLine, IncompleteRead, RemoteDisconnected, LineTooLong
    (UnicodeDecodeError, "decode"),  # a body that is not UTF-8
    (OSError, "connection"),  # refused, reset, unreachable, name resolution, TLS
    (ValueError, "request"),  # e.g. a URL that urllib cannot use
)
#: the kinds worth another attempt: the endpoint may answer next time
RETRIED = frozenset({"timeout", "protocol", "decode", "json", "connection"} | {f"http_{c}" for c in RETRY_STATUS})
#: what an attempt may raise; anything else is a bug, not the endpoint's failure
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ValueError)


class JudgeError(RuntimeError):
    """The endpoint failed: on every attempt, on one not worth retrying, or until the budget ran out."""


class BadAnswer(ValueError):
    """The endpoint answered, but not with a usable chat completion: not JSON (``json``, retried),
    JSON of the wrong shape (``envelope``) or too long (``too_large``), not retried: it would answer
    the same."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def failure_kind(exc: BaseException) -> str:
    """The counter key of one failed attempt: ``http_<status>``, a kind of :data:`KINDS`, or the
    kind of a :class:`BadAnswer` (``json``, ``envelope``, ``too_large``).

    >>> failure_kind(http.client.RemoteDisconnected("closed")), failure_kind(urllib.error.URLError(TimeoutError()))
    ('protocol', 'timeout')
    >>> failure_kind(UnicodeDecodeError("utf-8", b"\\xff", 0, 1, "invalid start byte"))
    'decode'
    """
    if isinstance(exc, urllib.error.HTTPError):
        return f"http_{exc.code}"
    if isinstance(exc, BadAnswer):
        return exc.kind
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        return failure_kind(exc.reason)  # urllib wraps what failed while connecting and sending
    return next((kind for cls, kind in KINDS if isinstance(exc, cls)), "other")


def describe(exc: BaseException) -> str:
    """A failed attempt in one short line (its kind is :func:`failure_kind`)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    return f"{type(exc).__name__}: {exc}"[:300]


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (``time.monotonic``); ``TimeoutError`` once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the judge call ran past its deadline")
    return left


class _DeadlineSocket:
    """A connected socket bounded by a total deadline: before each send and each read its timeout is
    set to the time left. urllib's own timeout is per read, so a server that trickles one byte at a
    time would otherwise hold a call for ever."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.raw, self.deadline = sock, deadline

    def arm(self) -> None:
        self.raw.settimeout(_left(self.deadline))

    def sendall(self, data: Any) -> None:
        self.arm()
        self.raw.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kw: Any) -> io.BufferedReader:
        """The response stream (``http.client`` asks for ``"rb"`` only)."""
        return io.BufferedReader(_DeadlineReader(self))

    def __getattr__(self, name: str) -> Any:  # close, fileno, ...: the socket's own
        return getattr(self.raw, name)


class _DeadlineReader(io.RawIOBase):
    """The socket's byte stream, each read armed with the time left. It holds the socket's own
    stream, so the socket stays open until the response is read even after urllib closes it."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        super().__init__()
        self._sock, self._stream = sock, sock.raw.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.arm()
        return self._stream.readinto(buffer)

    def close(self) -> None:
        self._stream.close()
        super().close()


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection whose socket ends every operation by ``deadline`` (connecting is bounded by
    the ``timeout`` urllib passes: the time left when the attempt starts)."""

    def __init__(self, *args: Any, deadline: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = cast(socket.socket, _DeadlineSocket(self.sock, self.deadline))


class _DeadlineHTTPSConnection(_DeadlineConnection, http.client.HTTPSConnection):
    """The same over TLS (the socket is wrapped after the handshake)."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_DeadlineConnection, deadline=self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_DeadlineHTTPSConnection, deadline=self.deadline), req)


def _opener(deadline: float) -> urllib.request.OpenerDirector:
    """urllib's default chain (proxies from the environment, redirects, HTTP errors raised) with both
    connection kinds bounded by ``deadline``, and no FTP or file handlers."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.UnknownHandler(),
        _HTTPHandler(deadline),
        _HTTPSHandler(deadline),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPRedirectHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _read_body(response: http.client.HTTPResponse, limit: int) -> bytes:
    """The whole body, in chunks (each read armed with the time left), at most ``limit`` bytes."""
    if response.length is not None and response.length > limit:
        raise BadAnswer("too_large", f"response of {response.length} bytes (limit {limit})")
    chunks: list[bytes] = []
    while chunk := response.read(65536):
        chunks.append(chunk)
        if sum(map(len, chunks)) > limit:
            raise BadAnswer("too_large", f"response over {limit} bytes")
    if response.length:  # declared bytes that never came: read(n) returns b"" where read() would raise
        raise http.client.IncompleteRead(b"".join(chunks), response.length)
    return b"".join(chunks)


def _content(body: bytes) -> str:
    """The assistant text of a chat-completion body; ``UnicodeDecodeError`` or :class:`BadAnswer`
    for anything else."""
    text = body.decode("utf-8")
    try:
        reply = json.loads(text)
    except (ValueError, RecursionError) as exc:  # not JSON, nested too deep, an integer too long
        raise BadAnswer("json", f"{type(exc).__name__}: {str(exc)[:200]}") from exc
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        content = None
    if not isinstance(content, str):
        raise BadAnswer("envelope", f"unexpected response envelope: {body[:200]!r}")
    return content


def post_chat(url: str, payload: dict[str, Any], headers: dict[str, str], deadline: float, max_bytes: int) -> str:
    """POST ``payload`` to ``url`` and return the assistant text of the chat completion, all by
    ``deadline`` (``time.monotonic``); raises one of :data:`TRANSPORT_ERRORS`."""
    request = urllib.request.Request(url, json.dumps(payload).encode(), headers, method="POST")
    try:
        with _opener(deadline).open(request, timeout=_left(deadline)) as response:
            body = _read_body(response, max_bytes)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the connection
        raise
    return _content(body)
