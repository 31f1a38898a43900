"""VitaBench tasks (MIT, github.com/meituan-longcat/vitabench) from a folder the user points to.

The folder holds ``<domain>_tasks_en.json`` (a JSON array of tasks) and ``tools_<domain>.json``
(OpenAI function schemas with an ``x-vita`` block: tool type, pre/post-conditions). Nothing is
packaged: pass ``path`` or set ``ENVACE_VITABENCH``. The tools' behaviour is not published with the
data, so tasks have no real environment (``env=None``); VitaBench's agent policy text is not in
the data either, so the system prompt is a short one with the task's clock (``system_prompt=``
overrides it; ``{domain}`` and ``{time}`` are filled in).

Per task: ``user_sim`` = the user profile, the instructions (the user's goal) and any message
history; ``extra["required_orders"]`` = the orders, table bookings and service reservations that
must exist at the end (``expected_states[].required_orders``, merged by id, the later state
winning; three orders that upstream misfiled among another order's products are lifted out),
``extra["initial_orders"]`` = those already in the task's database (id -> kind and
status), the rubrics (``state_rubrics``, ``overall_rubrics``) for an LLM judge, and the write tools.
VitaBench is an evaluation set: only ``split="all"`` (or ``"test"``) exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from envace.data.sources.records import RecordError, read_json
from envace.rewards.vitabench import order_key
from envace.types import Task

ENV_VAR = "ENVACE_VITABENCH"
DEFAULT_PROMPT = (
    "You are an AI assistant of a local-life service platform ({domain} scenario). Help the user with "
    "their request using the tools; confirm details with the user before placing, paying or cancelling. "
    "Current time: {time}."
)
_DB_TABLES: dict[str, str] = {"orders": "order", "books": "book", "reservations": "reservation"}


def _read_array(path: Path) -> list[Any]:
    data = read_json(path)
    if not isinstance(data, list):
        raise RecordError(path, None, None, f"expected a JSON array, got {type(data).__name__}")
    return data


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` checked to be of ``kind``; else a ValueError naming ``where.key``."""
    if not isinstance(obj, dict) or key not in obj or obj[key] is None:
        raise ValueError(f"{where}.{key}: missing")
    if not isinstance(obj[key], kind):
        raise ValueError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {type(obj[key]).__name__}")
    return obj[key]


def load_tools(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Tool schemas (without ``x-vita``) and the names of the WRITE tools of one ``tools_<domain>.json``."""
    tools, writes = [], []
    for i, raw in enumerate(_read_array(path)):
        fn = _need(raw, "function", dict, f"{path.name}[{i}]")
        name = _need(fn, "name", str, f"{path.name}[{i}].function")
        tools.append({k: v for k, v in raw.items() if k != "x-vita"})
        if (raw.get("x-vita") or {}).get("tool_type") == "WRITE":
            writes.append(name)
    return tools, writes


def lift_nested(order: dict[str, Any]) -> list[dict[str, Any]]:
    """An order, followed by any orders misfiled among its products (three upstream delivery records
    carry a whole order as a product entry), each lifted out as an order of its own.

    >>> inner = {"order_id": "B", "products": []}
    >>> [o["order_id"] for o in lift_nested({"order_id": "A", "products": [{"product_id": "p"}, inner]})]
    ['A', 'B']
    """
    products = order.get("products")
    if not isinstance(products, list) or not any(isinstance(p, dict) and "order_id" in p for p in products):
        return [order]
    nested = [p for p in products if isinstance(p, dict) and "order_id" in p]
    own = {**order, "products": [p for p in products if not (isinstance(p, dict) and "order_id" in p)]}
    return [own] + [o for n in nested for o in lift_nested(n)]


def required_orders(criteria: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The union of ``expected_states[].required_orders``, one entry per id, the later state winning."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for j, state in enumerate(_need(criteria, "expected_states", list, where)):
        here = f"{where}.expected_states[{j}]"
        for k, listed in enumerate(_need(state, "required_orders", list, here)):
            if not isinstance(listed, dict):
                raise ValueError(f"{here}.required_orders[{k}]: expected an object")
            for order in lift_nested(listed):
                try:
                    key = order_key(order)
                except ValueError:
                    raise ValueError(f"{here}.required_orders[{k}]: no order_id, book_id or reservation_id") from None
                merged.pop(key, None)
                merged[key] = order
    return list(merged.values())


def initial_orders(environment: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``{id: {"kind", "status"}}`` of the orders, bookings and reservations already in a task's database."""
    out = {}
    for table, kind in _DB_TABLES.items():
        rows = environment.get(table) or {}
        for row in rows.values() if isinstance(rows, dict) else rows:
            if isinstance(row, dict) and row.get(f"{kind}_id"):  # the row's own id (one key differs from it)
                out[str(row[f"{kind}_id"])] = {"kind": kind, "status": str(row.get("status", ""))}
    return out


def to_task(raw: Any, domain: str, where: str, tools: list[Any], writes: list[str], prompt: str) -> Task:
    """One VitaBench task object as a canonical :class:`Task` (see the module docstring)."""
    task_id = _need(raw, "id", (str, int), where)
    environment = _need(raw, "environment", dict, where)
    profile = _need(_need(raw, "user_scenario", dict, where), "user_profile", dict, f"{where}.user_scenario")
    criteria = _need(raw, "evaluation_criteria", dict, where)
    states = _need(criteria, "expected_states", list, f"{where}.evaluation_criteria")
    clock = str(environment.get("time", ""))
    return Task(
        id=str(task_id),
        benchmark="vitabench",
        category=domain,
        system_prompt=prompt.format(domain=domain, time=clock),
        tools=json.loads(json.dumps(tools)),
        user_sim={
            "profile": profile,
            "instructions": _need(raw, "instructions", str, where),
            "message_history": raw.get("message_history") or [],
        },
        env=None,
        extra={
            "required_orders": required_orders(criteria, f"{where}.evaluation_criteria"),
            "initial_orders": initial_orders(environment),
            "state_rubrics": [r for s in states for r in (s.get("state_rubrics") or [])],
            "overall_rubrics": list(criteria.get("overall_rubrics") or []),
            "time": clock,
            "user_id": environment.get("user_id"),
            "write_tools": list(writes),
        },
    )


def _domains(root: Path, domains: list[str] | tuple[str, ...] | None) -> list[str]:
    if domains is not None:
        return list(domains)
    found = sorted(p.name.removesuffix("_tasks_en.json") for p in root.glob("*_tasks_en.json"))
    if not found:
        raise ValueError(f"{root}: no <domain>_tasks_en.json files")
    return found


def load_vitabench(
    split: str = "all",
    path: str | None = None,
    domains: list[str] | tuple[str, ...] | None = None,
    system_prompt: str = DEFAULT_PROMPT,
    **kw: Any,
) -> list[Task]:
    """Load VitaBench tasks.

    Args:
        split: ``all`` (``test`` is the same set; there is no training split).
        path: the data folder; default ``$ENVACE_VITABENCH``.
        domains: e.g. ``["delivery", "instore"]``; default every ``<domain>_tasks_en.json`` found.
        system_prompt: template of the system prompt (``{domain}``, ``{time}``).
    """
    if kw:
        raise TypeError(f"load_vitabench: unexpected arguments {sorted(kw)}")
    if split not in ("all", "test"):
        raise ValueError(f"VitaBench is an evaluation set: split must be 'all' or 'test', got {split!r}")
    folder = path or os.environ.get(ENV_VAR)
    if not folder:
        raise ValueError(
            f"VitaBench data is not packaged: pass path=<folder with <domain>_tasks_en.json and "
            f"tools_<domain>.json> or set {ENV_VAR}"
        )
    root = Path(folder)
    tasks = []
    for domain in _domains(root, domains):
        tools, writes = load_tools(root / f"tools_{domain}.json")
        tasks_file = root / f"{domain}_tasks_en.json"
        for i, raw in enumerate(_read_array(tasks_file)):
            tasks.append(to_task(raw, domain, f"{tasks_file.name}[{i}]", tools, writes, system_prompt))
    return tasks
