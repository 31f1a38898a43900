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
from envace.data.sources.bfcl import call_string
from envace.envs.bfcl import BFCLEnvironment, public_state
from envace.protocol.parse import CallError
from envace.types import Task, is_error


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
            response = env.execute(call)
            error = response.get("error") if is_error(response) else None
            if isinstance(error, dict) and error.get("code") in (CallError.UNKNOWN_TOOL, CallError.INVALID_ARGUMENTS):
                rejected.append(f"turn {turn}: {error['message']}")
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


def verify_task(task: Task) -> dict[str, Any] | None:
    """Replay one task's gold through our environment and bfcl-eval's ``multi_turn_checker``.

    Every gold call must pass our environment's validation (tools visible at its turn, argument
    schema); the checker then runs the call strings rebuilt from our parsed calls against its own
    API instances, and our environment's final state must equal the checker's.

    Returns ``None`` on success, else ``{"reason": ..., "checker_valid": bool}`` (whether the
    checker alone accepted the rebuilt gold: True means the gold breaks its own tool docs).
    """
    decoded, env, rejected = _replay(task)
    why = _check(task, decoded, env)
    if rejected:  # our env skipped these calls, so the states cannot be compared
        checker_ok = why is None or why.startswith("our ")
        return {"reason": "gold rejected by the tool docs: " + "; ".join(rejected), "checker_valid": checker_ok}
    return None if why is None else {"reason": why, "checker_valid": why.startswith("our ")}


def verify_tasks(tasks: list[Task]) -> VerifyReport:
    """Check each task with :func:`verify_task`; groups are the tasks' categories."""
    report = VerifyReport()
    for task in tqdm(tasks, desc="verify bfcl multi-turn", unit="task", leave=False):
        failure = verify_task(task)
        report.add(task.category, failure is None, id=task.id, **(failure or {}))
    return report
