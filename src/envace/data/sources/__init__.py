"""Benchmark sources: each turns its records into canonical :class:`~envace.types.Task` objects.

A source is a function ``load(split: str = "all", path: str | None = None, **kw) -> list[Task]``,
registered here or named ``package.module:function`` in a config (the user's own);
a verifier replays gold through the real environment and the official checker and returns a
:class:`VerifyReport`. Both are looked up by name here (config data, never model output); a
:class:`SourceSpec` is one source to load as a config names it (the DataModule's ``sources``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import envace.envs  # noqa: F401  (registers python-env, the reward its TRL-shaped tasks name)
from envace.types import Task

SOURCES: dict[str, str] = {
    "bfcl-single-turn": "envace.data.sources.bfcl_single:load_single_turn",
    "bfcl-multi-turn": "envace.data.sources.bfcl:load_multi_turn",
    "tau2": "envace.data.sources.tau2:load_tau2",
    "vitabench": "envace.data.sources.vitabench:load_vitabench",
    "chatlog": "envace.data.sources.chatlog:load_chatlog",
    "prepared": "envace.data.sources.prepared:load_prepared",  # a folder `envace data prepare` wrote
    "tasks": "envace.data.sources.tasks:load_tasks",  # your own task file (docs/own-tools.md)
    "shopworld": "envace.data.sources.shopworld:load_shopworld",  # the procedural world (docs/shopworld.md)
}

VERIFIERS: dict[str, str] = {
    "bfcl-multi-turn": "envace.data.sources.bfcl_verify:verify_multi_turn",
    "tau2": "envace.data.sources.tau2:verify_tau2",
    "shopworld": "envace.data.sources.shopworld_verify:verify_shopworld",
}


@dataclass
class VerifyReport:
    """Gold replay results: how many tasks the official checker passed, per group."""

    passed: int = 0
    total: int = 0
    per_group: dict[str, tuple[int, int]] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)

    def add(self, group: str, ok: bool, **why: Any) -> None:
        p, t = self.per_group.get(group, (0, 0))
        self.per_group[group] = (p + int(ok), t + 1)
        self.passed += int(ok)
        self.total += 1
        if not ok:
            self.failures.append({"group": group, **why})


@dataclass(frozen=True)
class SourceSpec:
    """One benchmark source to load.

    Args:
        name: a registered source (``bfcl-multi-turn``, ``tau2``, ``vitabench``, ...).
        split: ``train``, ``test`` or ``all``.
        path: the source's own data location; default: the packaged copy.
        options: further keyword arguments of the source (``categories``, ``domains``, ...).
    """

    name: str
    split: str = "train"
    path: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: SourceSpec | dict[str, Any]) -> SourceSpec:
        """A spec from a flat dict (``{"name": ..., "split": ..., "categories": [...]}``) or a nested one
        (``{"name": ..., "options": {...}}``)."""
        if isinstance(spec, SourceSpec):
            return spec
        d = dict(spec)
        if not isinstance(d.get("name"), str):
            raise ValueError(f"a source needs a 'name' string: {spec!r}")
        name, split, path = d.pop("name"), d.pop("split", "train"), d.pop("path", None)
        options = {**dict(d.pop("options", None) or {}), **d}
        return cls(name=name, split=split, path=path, options=options)

    def load(self) -> list[Task]:
        return load_source(self.name, split=self.split, path=self.path, **self.options)


def _resolve(table: dict[str, str], name: str, what: str) -> Callable[..., Any]:
    """The function registered as ``name``, or the user's own named ``package.module:function``."""
    if name not in table and ":" in name:
        from envace.rewards.userfn import named_callable

        return named_callable(name, what)
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}")
    module, fn = table[name].split(":")
    return getattr(importlib.import_module(module), fn)  # type: ignore[no-any-return]


def load_source(name: str, split: str = "all", path: str | None = None, **kw: Any) -> list[Task]:
    """Load the tasks of source ``name`` for ``split`` (``train``, ``test`` or ``all``)."""
    tasks: list[Task] = _resolve(SOURCES, name, "source")(split=split, path=path, **kw)
    return tasks


def verify_source(name: str, split: str = "all", path: str | None = None, **kw: Any) -> VerifyReport:
    """Replay the gold of source ``name`` through its real environment and the official checker."""
    report: VerifyReport = _resolve(VERIFIERS, name, "verifier")(split=split, path=path, **kw)
    return report
