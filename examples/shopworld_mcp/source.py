"""ShopWorld's own-tools task files as tasks, each served its own world over MCP (a source of your own).

    data:
      sources:
        - name: examples.shopworld_mcp.source:load
          split: tune
          path: examples/shopworld_mcp/tasks
          options:
            env: {kind: mcp, server: {command: python, args: [examples/shopworld_mcp/server.py]}}

It reads the files as the ``tasks`` source does (:func:`envace.data.sources.tasks.load_tasks`: the
tool block is the server's ``tools/list``, read once per load, the same for every world), then gives
each task what a task file cannot say:

* **its world.** A row's ``metadata.orders`` (S5_control's hidden state) is appended to that task's
  stdio command as ``--orders <json>``: one process per episode, so each episode's server starts in
  its task's world, chosen by the task, never by the model, and with no extra tool. A task without
  orders keeps the server as configured (one command, one ``max_live`` bound for all of them).
* **its reward.** ``gold-writes`` by default (``gold-calls`` would also score the free reads), with
  ``extra["scored_tools"]`` and ``extra["held_out"]`` from the row, as ShopWorld's own source sets them.
* **the system prompt** of ShopWorld's own source, unless the options name another.

With ``env: {kind: python, class: envace.envs.shopworld:ShopWorld}`` the same rows run in-process:
``reset(**metadata)`` takes the orders there (``tests/examples/test_shopworld_mcp.py`` compares the two).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from envace.data.sources.shopworld import SYSTEM
from envace.data.sources.tasks import load_tasks
from envace.types import Task

TASKS = Path(__file__).resolve().parent / "tasks"
SERVER_ENV = {"kind": "mcp", "server": {"command": "python", "args": ["examples/shopworld_mcp/server.py"]}}


def with_world(task: Task) -> Task:
    """``task`` with its world on its server's command line, its scored tools and held-out flag in ``extra``.

    >>> t = Task("t", "tasks", env=SERVER_ENV, extra={"metadata": {"scored_tools": ["cancel_order"],
    ...          "orders": [{"order_id": "B1", "sku": "K7Q2", "quantity": 2}]}})
    >>> w = with_world(t)
    >>> w.env["server"]["args"]
    ['examples/shopworld_mcp/server.py', '--orders', '[{"order_id":"B1","sku":"K7Q2","quantity":2}]']
    >>> w.extra["scored_tools"], w.extra["held_out"]
    (['cancel_order'], False)
    """
    metadata = task.extra.get("metadata") or {}
    if not isinstance(metadata.get("scored_tools"), list):
        raise ValueError(f"task {task.id}: metadata.scored_tools (the tools gold-writes scores) is missing")
    extra = {**task.extra, "scored_tools": list(metadata["scored_tools"]), "held_out": bool(metadata.get("held_out"))}
    env, orders = task.env, metadata.get("orders")
    if orders and env and env.get("kind") == "mcp":
        server = env.get("server") or {}
        if "command" not in server:
            why = "its world (metadata.orders) goes on a stdio server's command line; a url serves one world"
            raise ValueError(f"task {task.id}: {why}")
        world = ["--orders", json.dumps(orders, separators=(",", ":"))]
        env = {**env, "server": {**server, "args": [*server.get("args", []), *world]}}
    return dataclasses.replace(task, env=env, extra=extra)


def load(split: str = "all", path: str | None = None, limit: int | None = None, **options: Any) -> list[Task]:
    """The tasks of ``split`` in ``path`` (default: this folder's ``tasks/``), each with its world (module
    docstring); ``limit``: the first ``limit`` (the strata cycle, so a multiple of 5 keeps them balanced)."""
    options = {"env": SERVER_ENV, "reward": "gold-writes", "system_prompt": SYSTEM, **options}
    return [with_world(t) for t in load_tasks(split, path or str(TASKS), **options)[:limit]]
