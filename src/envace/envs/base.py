"""The one protocol every real environment follows.

Model-written calls reach an environment only through :meth:`Environment.execute`, which first
validates the call against the tool schemas (:func:`envace.protocol.validate_call`) and then
dispatches to a whitelisted method. Nothing a model writes is passed to ``eval``/``exec``, and no
attribute a model can name freely is looked up.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod

from envace.types import JSON, Task, ToolCall, ToolSchema

# env kind -> "module:Class". Config data, never model output.
ENVIRONMENTS: dict[str, str] = {
    "bfcl": "envace.envs.bfcl:BFCLEnvironment",
    "tau2": "envace.envs.tau2:Tau2Environment",
}


class Environment(ABC):
    """A live, stateful environment for one episode."""

    @abstractmethod
    def tools(self) -> list[ToolSchema]:
        """Schemas of the tools this environment executes."""

    @abstractmethod
    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        """Run one call; failures come back as ``{"error": {"code", "message"}}``, never raised.

        Model-written calls are always validated; ``validate=False`` is only for replaying a
        benchmark's own gold, which the official harness executes without a schema check.
        """

    @abstractmethod
    def snapshot(self) -> JSON:
        """A JSON view of the state, for comparing two environments."""

    def set_turn(self, turn: int) -> None:  # noqa: B027 - optional hook
        """Tell the environment the conversation reached user turn ``turn`` (tools may appear)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the environment holds."""


def make_environment(task: Task) -> Environment | None:
    """Build a fresh real environment for ``task``, or ``None`` when it has none."""
    if not task.env:
        return None
    kind = task.env["kind"]
    if kind not in ENVIRONMENTS:
        raise ValueError(f"task {task.id}: unknown environment kind {kind!r}; known: {sorted(ENVIRONMENTS)}")
    module, cls = ENVIRONMENTS[kind].split(":")
    env_cls = getattr(importlib.import_module(module), cls)
    env: Environment = env_cls.from_task(task)
    return env
