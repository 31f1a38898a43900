"""Gold replay for BFCL multi-turn: our environment and bfcl-eval's official ``multi_turn_checker``.

bfcl-eval keeps its API instances in ``multi_turn_utils`` module globals keyed by model name and
task id; every check here uses a fresh model name and deletes its instances afterwards.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from tqdm import tqdm

from envace._bfcl import bfcl_module
from envace.data.sources import VerifyReport
from envace.data.sources.bfcl import call_string, load_multi_turn
from envace.envs.bfcl import BFCLEnvironment, public_state
from envace.protocol.parse import validate_call
from envace.types import Task


def _instance_key(model_name: str, task_id: str, class_name: str) -> str:
    """The module-global name bfcl-eval's checker gives a model-side instance (``is_evaL_run=True``)."""
    return re.sub(r"[-./:]", "_", f"{model_name}_eval_{task_id}_{class_name}_instance")


def _replay(task: Task) -> tuple[list[list[list[str]]], BFCLEnvironment, list[str]]:
    """Run the gold through our environment: per-turn call strings, the env, and the calls it rejected."""
    env = BFCLEnvironment.from_task(task)
    decoded: list[list[list[str]]] = []
    rejected = []
    for turn, calls in enumerate(task.gold):
        env.set_turn(turn)
        for call in calls:
            invalid = validate_call(call, env.tools())
            if invalid is not None:  # benchmark gold that breaks its own tool docs: noted, run as upstream does
                rejected.append(f"turn {turn}: {invalid['error']['message']}")
            env.execute(call, validate=False)
        decoded.append([[call_string(c) for c in calls]] if calls else [])
    return decoded, env, rejected


def _check(task: Task, decoded: list[list[list[str]]], env: BFCLEnvironment) -> str | None:
    checker = bfcl_module("eval_checker.multi_turn_eval.multi_turn_checker")
    store = vars(bfcl_module("eval_checker.multi_turn_eval.multi_turn_utils"))
    model_name = f"envace_verify_{uuid.uuid4().hex}"  # bfcl-eval caches instances per model name + id
    env_spec = task.env or {}
    entry = {
        "id": task.id,
        "initial_config": env_spec["initial_config"],
        "involved_classes": env_spec["involved_classes"],
    }
    try:
        result = checker.multi_turn_checker(decoded, task.extra["ground_truth"], entry, task.category, model_name)
        if not result["valid"]:
            return f"{result.get('error_type')}: {result.get('error_message')}"
        for class_name, instance in env.instances().items():
            theirs = store.get(_instance_key(model_name, task.id, class_name))
            if theirs is not None and public_state(theirs) != public_state(instance):
                return f"our {class_name} state differs from the checker's"
        return None
    except Exception as exc:  # the checker's own asserts
        return f"checker raised {type(exc).__name__}: {exc}"
    finally:
        prefix = re.sub(r"[-./:]", "_", model_name)
        for key in [k for k in store if k.startswith(prefix)]:
            del store[key]


def verify_task(task: Task) -> tuple[dict[str, Any] | None, list[str]]:
    """Replay one task's gold through our environment and bfcl-eval's ``multi_turn_checker``.

    Gold is the benchmark's data, so it runs as the official harness runs it (no schema check; the
    dispatch stays whitelisted). The checker then runs the call strings rebuilt from our parsed
    calls against its own API instances, and our environment's final state must equal the checker's.

    Returns ``(failure, notes)``: ``failure`` is ``None`` on success, else ``{"reason": ...}``;
    ``notes`` lists gold calls that break their own tool docs (a model making them would get an
    ``INVALID_ARGUMENTS``/``UNKNOWN_TOOL`` error).
    """
    decoded, env, rejected = _replay(task)
    why = _check(task, decoded, env)
    return (None if why is None else {"reason": why}), rejected


def verify_tasks(tasks: list[Task]) -> VerifyReport:
    """Check each task with :func:`verify_task`; groups are the tasks' categories."""
    report = VerifyReport()
    for task in tqdm(tasks, desc="verify bfcl multi-turn", unit="task", leave=False):
        failure, notes = verify_task(task)
        report.add(task.category, failure is None, id=task.id, **(failure or {}))
        report.notes.extend({"id": task.id, "gold_breaks_schema": n} for n in notes)
    return report


def verify_multi_turn(
    split: str = "all", path: str | None = None, categories: list[str] | None = None, limit: int | None = None
) -> VerifyReport:
    """Replay the gold of every multi-turn task in our environment and bfcl-eval's checker.

    Groups are the categories; see :func:`verify_task`.

    Args:
        split: as in :func:`load_multi_turn`.
        path: as in :func:`load_multi_turn`.
        categories: as in :func:`load_multi_turn`.
        limit: check only the first ``limit`` tasks of each category.
    """
    tasks = load_multi_turn(split, path, categories)
    if limit is not None:
        kept: dict[str, list[Task]] = {}
        for task in tasks:
            kept.setdefault(task.category, []).append(task)
        tasks = [t for group in kept.values() for t in group[:limit]]
    return verify_tasks(tasks)
