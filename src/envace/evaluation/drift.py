"""``envace evaluate --drift``: evaluate a policy on a real environment that changed after training.

    envace evaluate --config configs/eval/bfcl.yaml --tasks.categories [multi_turn_base] \
        --drift rename_keys,add_fields --drift.mode silent --drift.seed 0

Every selected task is drifted (:func:`envace.envs.drifted_task`: its tool block as the mode shows it,
its environment wrapped), the rest of the evaluation runs unchanged, and the official checkers score
the canonical calls (docs/drift.md). ``summary.json`` records the spec under ``drift``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envace.envs import DriftSpec, drifted_task
from envace.types import Task

#: categories whose tasks do not run under drift, and why
NOT_DRIFTED = {
    "memory_kv": "its prerequisite conversations and its oracle read undrifted memory snapshots",
    "memory_rec_sum": "its prerequisite conversations and its oracle read undrifted memory snapshots",
}


@dataclass
class DriftConfig:
    """A drift of every task's real environment (``--drift KINDS``, ``--drift.mode``, ``--drift.seed``).

    Args:
        kinds: the kinds of :data:`envace.envs.DRIFT_KINDS`, comma-separated or a list, applied in
            this order (``None``: no drift).
        mode: ``documented`` (the tool block shows the drift) or ``silent`` (the docs as trained).
        seed: every choice of the drift follows from it.
    """

    kinds: str | list[str] | None = None
    mode: str = "documented"
    seed: int = 0

    def spec(self) -> DriftSpec | None:
        """The :class:`~envace.envs.DriftSpec` (``None`` without kinds); a bad value is a one-line ``ValueError``."""
        if self.kinds is None:
            return None
        text = self.kinds if isinstance(self.kinds, str) else ",".join(self.kinds)
        return DriftSpec.parse(text, mode=self.mode, seed=self.seed)


def drift_tasks(tasks: list[Task], spec: DriftSpec) -> list[Task]:
    """``tasks`` under ``spec``; a task that cannot drift (no real environment, or a category of
    :data:`NOT_DRIFTED`) is a one-line ``ValueError`` naming it."""
    for task in tasks:
        if task.category in NOT_DRIFTED:
            raise ValueError(
                f"--drift: category {task.category} does not run under drift: {NOT_DRIFTED[task.category]}"
            )
        if not task.env:
            raise ValueError(f"--drift: task {task.id} ({task.benchmark} {task.category}) has no real environment to "
                             "drift; select categories that run against one (BFCL multi-turn, tau2)")  # fmt: skip
    return [drifted_task(t, spec) for t in tasks]


def drift_note(spec: DriftSpec) -> str:
    """The line under the table."""
    return (f"drift: {', '.join(spec.kinds)} ({spec.mode}, seed {spec.seed}): every task's environment answers "
            "drifted; the official checkers score the canonical calls (docs/drift.md)")  # fmt: skip


def drift_shorthand(argv: Sequence[str]) -> list[str]:
    """``--drift KINDS`` (or ``--drift=KINDS``) as ``--drift.kinds KINDS``: the flag names the kinds,
    its fields follow (``--drift.mode``); a YAML mapping or ``null`` after ``--drift`` stays as it is.

    >>> drift_shorthand(["--drift", "units,rename_keys", "--drift.mode", "silent", "--drift={kinds: units}"])
    ['--drift.kinds', 'units,rename_keys', '--drift.mode', 'silent', '--drift={kinds: units}']
    """
    out: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        value = arg.split("=", 1)[1] if arg.startswith("--drift=") else None
        if arg == "--drift" and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        if value is not None and not value.lstrip().startswith("{") and value not in ("null", "none", "None"):
            out += ["--drift.kinds", value]
        elif value is not None:
            out.append(f"--drift={value}")
        else:
            out.append(arg)
        i += 1
    return out
