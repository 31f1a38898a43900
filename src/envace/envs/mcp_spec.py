"""Which MCP server an environment talks to, and its deadlines: :class:`ServerSpec`, read from config data.

A task's ``env`` names it (``{"kind": "mcp", "server": {...}}``), as a stdio command or a
streamable-HTTP URL::

    {"command": "python", "args": ["examples/shop_mcp/server.py"], "env": {}, "cwd": null}
    {"url": "http://127.0.0.1:8000/mcp"}

(``python`` as the command is the interpreter running envace, so the server sees its packages),
with optional deadlines (``connect_timeout_s``, ``list_timeout_s``, ``call_timeout_s``) and the
bound on live servers (``max_live``). Every field is checked here, once: a wrong one is a one-line
:class:`ValueError` naming it.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

FIELDS = ("command", "args", "env", "cwd", "url", "connect_timeout_s", "list_timeout_s", "call_timeout_s", "max_live")


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server: how to reach it, how long each step may take, how many may be live at once.

    Args:
        command: the executable of a stdio server (one process per session).
        args: its arguments.
        env: environment variables added to the SDK's default environment of the process.
        cwd: its working directory.
        url: a streamable-HTTP endpoint (one MCP session per episode on the running server).
        connect_timeout_s: most seconds to start the server (or connect) and initialise the session.
        list_timeout_s: most seconds for ``tools/list`` (all pages).
        call_timeout_s: most seconds for one ``tools/call``.
        max_live: most sessions of this server open at once in this process (stdio: processes).
    """

    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    connect_timeout_s: float = 20.0
    list_timeout_s: float = 10.0
    call_timeout_s: float = 10.0
    max_live: int = 32

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of 'command' (stdio) or 'url' (streamable HTTP)")
        if self.url is not None and urlparse(self.url).scheme not in ("http", "https"):
            raise ValueError(f"url {self.url!r}: not an http(s) URL")
        for name in ("connect_timeout_s", "list_timeout_s", "call_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be a number of seconds in (0, 3600], got {value!r}")
        if isinstance(self.max_live, bool) or not isinstance(self.max_live, int) or self.max_live < 1:
            raise ValueError(f"max_live must be a positive integer, got {self.max_live!r}")

    @classmethod
    def parse(cls, data: Mapping[str, Any] | ServerSpec) -> ServerSpec:
        """A spec from config data; unknown or mistyped fields are a one-line :class:`ValueError`.

        >>> ServerSpec.parse({"command": "node", "args": ["s.js"], "call_timeout_s": 2}).label
        'node s.js'
        >>> ServerSpec.parse({"url": "http://127.0.0.1:8000/mcp", "max_live": 0})
        Traceback (most recent call last):
        ValueError: max_live must be a positive integer, got 0
        >>> ServerSpec.parse({"comand": "python"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: unknown MCP server field 'comand'; fields: command, args, env, cwd, url, connect_timeout_s, ...
        """
        if isinstance(data, ServerSpec):
            return data
        if not isinstance(data, Mapping):
            raise ValueError(f"an MCP server is a mapping with 'command' or 'url', not {type(data).__name__}")
        for key in data:
            if key not in FIELDS:
                raise ValueError(f"unknown MCP server field {key!r}; fields: {', '.join(FIELDS)}")
        d = dict(data)
        args, env = d.pop("args", None) or [], d.pop("env", None) or {}
        if not isinstance(args, list | tuple) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"args must be a list of strings, got {args!r}")
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError(f"env must map strings to strings, got {env!r}")
        for key in ("command", "cwd", "url"):
            if d.get(key) is not None and not isinstance(d[key], str):
                raise ValueError(f"{key} must be a string, got {d[key]!r}")
        if d.get("command") == "python":  # the interpreter running envace: the server sees the same packages
            d["command"] = sys.executable
        return cls(args=tuple(args), env=tuple(sorted(env.items())), **d)

    def to_json(self) -> dict[str, Any]:
        """The config data :meth:`parse` reads back."""
        out: dict[str, Any] = {"url": self.url} if self.url else {"command": self.command, "args": list(self.args)}
        if self.env:
            out["env"] = dict(self.env)
        if self.cwd:
            out["cwd"] = self.cwd
        defaults = ServerSpec(command="x")
        for name in ("connect_timeout_s", "list_timeout_s", "call_timeout_s", "max_live"):
            if getattr(self, name) != getattr(defaults, name):
                out[name] = getattr(self, name)
        return out

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the server (its live-session bound is shared by every task naming it)."""
        return (self.url,) if self.url else (self.command, self.args, self.env, self.cwd)

    @property
    def label(self) -> str:
        """The server as one short line (its command line, or its URL)."""
        if self.url:
            return self.url
        return shlex.join([self.command or "", *self.args])[:120]
