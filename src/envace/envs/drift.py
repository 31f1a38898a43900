"""Drift: a real environment whose answers have changed since the policy's docs were written.

:class:`DriftedEnvironment` wraps any :class:`~envace.envs.base.Environment` and transforms what it
returns by named, seeded kinds (:data:`~envace.envs.drift_kinds.KINDS`: keys renamed, nested or
reordered, fields added, numbers as strings, other units or date formats, errors reworded, tools
renamed), applied in the order the :class:`DriftSpec` names them. Two modes:

* ``documented``: the tool block the policy sees is updated to match (:meth:`DriftSpec.visible_tools`);
* ``silent``: the docs stay as they were trained; only the answers change.

Drift changes what the agent sees, never what success is. The wrapped environment executes the
canonical calls (a renamed tool's new name is mapped back before it runs; its old name is refused
with an error naming the new one), so its state is the state of an undrifted run; the messages the
official checkers read are mapped back too (:func:`canonical_messages`). docs/drift.md says per
benchmark how the official scorer stays valid.

A task carries its drift in ``task.env["drift"]`` (:func:`drifted_task`): the rollout renders the
drifted tool block from ``task.tools``, validates calls against :func:`accepted_tools` (the names the
drifted environment answers to), and :func:`make_environment` (what ``envace.envs`` exports) builds
the canonical environment and wraps it. Scorers read the episode as the benchmark knows it:
:func:`canonical_task`, :func:`canonical_messages`, :func:`canonical_calls`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from envace.envs import base
from envace.envs.base import DEFAULT_CALL_TIMEOUT_S, Environment, json_safe
from envace.envs.drift_kinds import KINDS, drift_response, drift_tools, renamed_tools, tool_renaming
from envace.envs.drift_support import Chooser
from envace.protocol.parse import CallError, tool_name
from envace.types import JSON, CallRecord, Message, Task, ToolCall, ToolSchema, error_observation

Mode = Literal["documented", "silent"]
MODES: tuple[Mode, ...] = ("documented", "silent")
DRIFT_KEY = "drift"  # task.env[DRIFT_KEY]: the spec, the renaming, and the canonical tools


@dataclass(frozen=True)
class DriftSpec:
    """Which drift, how it is documented, and its seed.

    Args:
        kinds: names of :data:`~envace.envs.drift_kinds.KINDS`, applied in this order.
        mode: ``documented`` (the tool block is updated to match) or ``silent`` (it is not).
        seed: every choice (a key's new name, a date format, which tools are renamed) follows from it.

    >>> DriftSpec.parse("rename_keys, add_fields", seed=3)
    DriftSpec(kinds=('rename_keys', 'add_fields'), mode='documented', seed=3)
    >>> DriftSpec.parse("rename_key")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: unknown drift kind 'rename_key'; valid kinds: rename_keys, nest_result, ...
    """

    kinds: tuple[str, ...]
    mode: Mode = "documented"
    seed: int = 0

    def __post_init__(self) -> None:
        problem = _problem(self.kinds, self.mode, self.seed)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def parse(cls, text: str, mode: str = "documented", seed: int = 0) -> DriftSpec:
        """A spec from a comma-separated list of kinds (a CLI flag: ``"rename_keys,add_fields"``)."""
        kinds = tuple(k.strip() for k in str(text).split(",") if k.strip())
        return cls(kinds, cast(Mode, mode), seed)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DriftSpec:
        """The spec of :meth:`to_json`."""
        return cls(tuple(data.get("kinds") or ()), data.get("mode", "documented"), data.get("seed", 0))

    def to_json(self) -> dict[str, Any]:
        return {"kinds": list(self.kinds), "mode": self.mode, "seed": self.seed}

    @property
    def rng(self) -> Chooser:
        return Chooser(self.seed)

    def respond(self, response: JSON) -> JSON:
        """``response`` through every kind, in order, made JSON-safe again."""
        for kind in self.kinds:
            response = drift_response(kind, response, self.rng)
        return json_safe(response)

    def renaming(self, names: Sequence[str]) -> dict[str, str]:
        """``{old: new}`` of the tools this spec renames among ``names`` (all the task's tools)."""
        return tool_renaming(names, self.rng) if "rename_tool" in self.kinds else {}

    def documented_tools(self, tools: list[ToolSchema], renaming: Mapping[str, str]) -> list[ToolSchema]:
        """``tools`` as documented drift updates them (deep copies), renamed by ``renaming``."""
        for kind in self.kinds:
            renamed = kind == "rename_tool"
            tools = renamed_tools(tools, dict(renaming)) if renamed else drift_tools(kind, tools, self.rng)
        return tools

    def visible_tools(self, tools: list[ToolSchema], renaming: Mapping[str, str]) -> list[ToolSchema]:
        """The tool block the policy sees: updated in documented mode, as trained in silent mode."""
        return self.documented_tools(tools, renaming) if self.mode == "documented" else list(tools)


def _problem(kinds: Any, mode: Any, seed: Any) -> str | None:
    """Why a spec is not valid (one line), or ``None``."""
    if not isinstance(kinds, tuple) or not kinds:
        return f"drift needs at least one kind; valid kinds: {', '.join(KINDS)}"
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        return f"unknown drift kind {unknown[0]!r}; valid kinds: {', '.join(KINDS)}"
    if len(set(kinds)) != len(kinds):
        return f"drift kinds named twice: {', '.join(kinds)}"
    if mode not in MODES:
        return f"unknown drift mode {mode!r}; valid modes: {', '.join(MODES)}"
    if not isinstance(seed, int) or isinstance(seed, bool):
        return f"drift seed must be an integer, not {type(seed).__name__}"
    return None


class DriftedEnvironment(Environment):
    """``env`` behind a drift: the same protocol, drifted answers and (documented mode) docs.

    Args:
        env: the real environment, executing canonical calls only.
        spec: the drift.
        renaming: ``{old: new}`` tool names (``rename_tool``); default: the spec's renaming of the
            tools ``env`` lists now (pass the task's, :func:`drifted_task` stores it, when tools
            appear later).
    """

    def __init__(self, env: Environment, spec: DriftSpec, renaming: Mapping[str, str] | None = None) -> None:
        super().__init__(env.call_timeout_s)
        self.inner, self.spec = env, spec
        names = [tool_name(t) for t in env.tools()]
        self.renaming = dict(renaming) if renaming is not None else spec.renaming(names)
        self._canonical = {new: old for old, new in self.renaming.items()}

    def tools(self) -> list[ToolSchema]:
        """The tools visible now, as the policy sees them (:meth:`DriftSpec.visible_tools`)."""
        return self.spec.visible_tools(self.inner.tools(), self.renaming)

    def canonical(self, call: ToolCall) -> ToolCall:
        """``call`` under the name the wrapped environment knows (a renamed tool's new name mapped back)."""
        name = self._canonical.get(call.name)
        return call if name is None else ToolCall(name, call.arguments)

    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        """Run the canonical form of ``call`` and drift its answer; a renamed tool's old name runs
        nothing and answers ``UNKNOWN_TOOL`` naming the new one."""
        if call.name in self.renaming:
            new = self.renaming[call.name]
            why = f"tool {call.name!r} was renamed to {new!r}; call {new!r} with the same arguments"
            return self.spec.respond(error_observation(CallError.UNKNOWN_TOOL, why))
        return self.spec.respond(self.inner.execute(self.canonical(call), validate))

    @property
    def broken(self) -> bool:
        return self.inner.broken

    def snapshot(self) -> JSON:
        """The wrapped environment's state: drift changes answers, never state."""
        return self.inner.snapshot()

    def set_turn(self, turn: int) -> None:
        self.inner.set_turn(turn)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        """The wrapped environment's own extras (tau2's ``history``, ``db_hashes``, ``execute_user``:
        the user's side is not drifted)."""
        if name.startswith("_") or name in ("inner", "spec", "renaming"):
            raise AttributeError(name)
        return getattr(self.inner, name)


# --------------------------------------------------------------------------- tasks


def _all_names(task: Task) -> list[str]:
    return [tool_name(t) for t in task.tools_at(10**9)]


def drifted_task(task: Task, spec: DriftSpec) -> Task:
    """``task`` as a policy meets it under ``spec``: its tool block (and tools added later) as the
    mode shows them, and the drift in ``env["drift"]`` (with the renaming and the canonical tools,
    from which :func:`make_environment` builds the real environment). Gold, ground truth and the
    official checkers' inputs are shared unchanged; ``task`` itself is not changed.

    Raises ValueError (one line) for a task without an environment (BFCL single-turn: drift n/a) or
    one already drifted.
    """
    if not task.env:
        raise ValueError(f"task {task.id}: no environment to drift (drift wraps a real environment)")
    if DRIFT_KEY in task.env:
        raise ValueError(f"task {task.id}: already drifted")
    renaming = spec.renaming(_all_names(task))
    record = {**spec.to_json(), "renaming": renaming, "tools": copy.deepcopy(task.tools),
              "tools_added": copy.deepcopy(task.tools_added)}  # fmt: skip
    added = {k: spec.visible_tools(v, renaming) for k, v in task.tools_added.items()}
    tools = spec.visible_tools(copy.deepcopy(task.tools), renaming)
    return dataclasses.replace(task, tools=tools, tools_added=added, env={**task.env, DRIFT_KEY: record})


def task_drift(task: Task) -> tuple[DriftSpec, dict[str, str]] | None:
    """The drift of a task made by :func:`drifted_task` (its spec and renaming), or ``None``."""
    record = (task.env or {}).get(DRIFT_KEY)
    if record is None:
        return None
    return DriftSpec.from_json(record), dict(record.get("renaming") or {})


def canonical_task(task: Task) -> Task:
    """The undrifted task of a drifted one (``task`` itself when it has no drift): its own tools
    (the tools added at turns ``task`` still has), ``env`` without the drift."""
    record = (task.env or {}).get(DRIFT_KEY)
    if record is None:
        return task
    env = {k: v for k, v in (task.env or {}).items() if k != DRIFT_KEY}
    added = {k: v for k, v in record["tools_added"].items() if k in task.tools_added}
    return dataclasses.replace(task, tools=list(record["tools"]), tools_added=added, env=env)


def _back(task: Task) -> tuple[dict[str, str], dict[str, str]] | None:
    """``({old: new}, {new: old})`` of a task that renames tools, else ``None``."""
    drift = task_drift(task)
    if drift is None or not drift[1]:
        return None
    return drift[1], {new: old for old, new in drift[1].items()}


def canonical_messages(task: Task, messages: list[Message]) -> list[Message]:
    """``messages`` as the benchmark's checker must read them: renamed tools under their canonical
    names, and calls of an old name left out (the environment refused them: they never ran).
    ``messages`` itself when ``task`` renames no tool."""
    names = _back(task)
    if names is None:
        return messages
    renaming, back = names
    out = []
    for m in messages:
        calls = [ToolCall(back.get(c.name, c.name), c.arguments) for c in m.tool_calls if c.name not in renaming]
        name = back.get(m.name, m.name) if m.name is not None else None
        out.append(dataclasses.replace(m, tool_calls=calls, name=name))
    return out


def canonical_calls(task: Task, calls: list[CallRecord]) -> list[CallRecord]:
    """The call records of an episode as a proxy reward must read them (as :func:`canonical_messages`:
    new names mapped back, refused old-name calls left out; the responses stay as they were drifted).
    ``calls`` itself when ``task`` renames no tool."""
    names = _back(task)
    if names is None:
        return calls
    renaming, back = names
    return [CallRecord(ToolCall(back.get(r.call.name, r.call.name), r.call.arguments), r.response)
            for r in calls if r.call.name not in renaming]  # fmt: skip


def accepted_tools(task: Task, turn: int) -> list[ToolSchema]:
    """The schemas a call of ``task`` is validated against at ``turn``, before it reaches the
    environment: the docs the policy sees (``task.tools_at(turn)``) and, under silent drift, the
    renamed tools under their new names, which the drifted environment answers to (its refusal of an
    old name names the new one; documented drift already shows them). The docs themselves for a
    task without renamed tools. An imagined copy of an episode validates alike: it has the task,
    not an environment."""
    docs = task.tools_at(turn)
    drift = task_drift(task)
    if drift is None or not drift[1] or drift[0].mode == "documented":
        return docs
    new = set(drift[1].values())
    renamed = renamed_tools(canonical_task(task).tools_at(turn), drift[1])
    return [*docs, *(t for t in renamed if tool_name(t) in new)]


def documented_calls(task: Task, calls: Sequence[ToolCall]) -> list[ToolCall]:
    """Canonical ``calls`` as a policy reading the drifted docs writes them (documented mode renames;
    silent mode leaves them as trained)."""
    drift = task_drift(task)
    if drift is None or drift[0].mode == "silent":
        return list(calls)
    renaming = drift[1]
    return [ToolCall(renaming.get(c.name, c.name), c.arguments) for c in calls]


def with_drift(task: Task, env: Environment) -> Environment:
    """``env`` (built from :func:`canonical_task` of ``task``) behind the task's drift, or ``env`` itself
    when the task has none: for callers that build their own environment (tau2's solo mode)."""
    drift = task_drift(task)
    return env if drift is None else DriftedEnvironment(env, drift[0], drift[1])


def make_environment(task: Task, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> Environment | None:
    """:func:`envace.envs.base.make_environment`, wrapped in the task's drift when it has one."""
    env = base.make_environment(canonical_task(task), call_timeout_s)
    return None if env is None else with_drift(task, env)
