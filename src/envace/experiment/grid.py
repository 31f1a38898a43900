"""What an experiment is: its configuration and its units (the warm start, the runs, their evaluations).

A unit is the smallest piece of work that leaves a result file: ``warm_start`` (the grounded warm
start every arm starts from), ``eval-warm_start``, and for each seed and arm ``run-<arm>-s<seed>``
(an ordinary ``envace fit`` from the warm start) then ``eval-<arm>-s<seed>``. Units are ordered so
that a partly run grid holds whole seeds: every arm of seed 0 before any of seed 1.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envace.paths import cache_dir

KINDS = ("warm_start", "run", "eval")


@dataclass
class EvalSpec:
    """How every policy of the grid is evaluated: held-out BFCL multi-turn tasks, committed against the
    real environment and scored by bfcl-eval's official checker, with and without private rehearsal.

    Args:
        splits: ``val`` (unseen scenarios of the training API classes) and ``test`` (unseen classes),
            reported apart.
        categories: BFCL multi-turn categories.
        max_user_turns: cut every task to its first user turns (the training episodes' length).
        max_prompt_tokens: keep the tasks whose prompt fits (as training's ``val_max_prompt_tokens``).
        tasks_per_split: at most this many tasks per split, spread over the split (``None``: all).
        n_values: private-rehearsal attempts per committed turn (0: plain execution).
        modes: private-rehearsal modes for every ``n > 0`` (``parallel``, ``sequential``).
        temperature: sampling temperature of the evaluation (0: greedy).
        batch_tasks: tasks whose episodes generate together.
    """

    splits: list[str] = field(default_factory=lambda: ["val", "test"])
    categories: list[str] = field(default_factory=lambda: ["multi_turn_base"])
    max_user_turns: int = 1
    max_prompt_tokens: int | None = 1300
    tasks_per_split: int | None = None
    n_values: list[int] = field(default_factory=lambda: [0, 2])
    modes: list[str] = field(default_factory=lambda: ["parallel", "sequential"])
    temperature: float = 0.0
    batch_tasks: int = 16


@dataclass
class ExperimentConfig:
    """An experiment: one warm start, arms × seeds of RL runs from it, every policy evaluated.

    Args:
        name: the experiment's name (its folders are named after it).
        base: the fit config every unit runs (``configs/bfcl.yaml``): data, model, limits, sampling.
        arms: overlays of ``configs/arms/`` (``envace``, ``real_env``, ``simulator``, ``sft_only``, ...).
        seeds: seeds of every arm's run (``seed_everything``).
        warm_start_steps: grounded supervised steps of the shared warm start.
        rl_steps: optimizer steps of every run after the warm start (``sft_only``: supervised steps).
        val_every: validation interval of the runs (their ``val/*`` curves; 0: none).
        fit_args: further ``envace fit`` arguments for every fit (``--data.val_tasks 8``, ...).
        results: the folder of the result files and the report (small files, kept in the repository).
        work: the folder of checkpoints and logs (default: ``$ENVACE_CACHE/experiments/<name>``).
        evaluation: how every policy is evaluated.
    """

    name: str
    base: str
    arms: list[str]
    seeds: list[int] = field(default_factory=lambda: [0])
    warm_start_steps: int = 32
    rl_steps: int = 16
    val_every: int = 8
    fit_args: list[str] = field(default_factory=list)
    results: str | None = None
    work: str | None = None
    evaluation: EvalSpec = field(default_factory=EvalSpec)

    def __post_init__(self) -> None:
        if not self.arms or not self.seeds:
            raise ValueError("an experiment needs at least one arm and one seed")
        if len(set(self.arms)) != len(self.arms) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"arms and seeds must not repeat: {self.arms}, {self.seeds}")
        if self.warm_start_steps < 1 or self.rl_steps < 1:
            raise ValueError("warm_start_steps and rl_steps must be >= 1")

    @property
    def results_dir(self) -> Path:
        return Path(self.results or f"docs/experiments/{self.name}")

    @property
    def work_dir(self) -> Path:
        return Path(self.work) if self.work else cache_dir() / "experiments" / self.name

    def metadata(self) -> dict[str, Any]:
        """``experiment.json``: what the report needs to know of the grid."""
        ev = self.evaluation
        settings = ["none"] + [f"{m}@{n}" for n in sorted(set(ev.n_values)) if n > 0 for m in ev.modes]
        return {"name": self.name, "arms": list(self.arms), "seeds": list(self.seeds), "reference_arm": "envace",
                "splits": list(ev.splits), "settings": settings, "config": asdict(self)}  # fmt: skip


@dataclass(frozen=True)
class Unit:
    """One piece of work that leaves one result file (``units/<key>.json``).

    Attributes:
        key: ``warm_start``, ``eval-warm_start``, ``run-<arm>-s<seed>`` or ``eval-<arm>-s<seed>``.
        kind: ``warm_start``, ``run`` or ``eval``.
        arm: the run's arm (``warm_start`` for the warm start and its evaluation).
        seed: the run's seed (``None`` for the warm start).
        needs: the keys of the units whose results this one starts from.
    """

    key: str
    kind: str
    arm: str
    seed: int | None = None
    needs: tuple[str, ...] = ()

    @property
    def policy(self) -> str:
        """The name of the policy an ``eval`` unit evaluates (``warm_start`` or ``<arm>-s<seed>``)."""
        return self.key.removeprefix("eval-")


def units(cfg: ExperimentConfig) -> list[Unit]:
    """The grid's units, in the order they run (each after the units it needs)."""
    out = [Unit("warm_start", "warm_start", "warm_start"),
           Unit("eval-warm_start", "eval", "warm_start", needs=("warm_start",))]  # fmt: skip
    for seed in cfg.seeds:
        for arm in cfg.arms:
            run = f"run-{arm}-s{seed}"
            out += [Unit(run, "run", arm, seed, ("warm_start",)),
                    Unit(f"eval-{arm}-s{seed}", "eval", arm, seed, (run,))]  # fmt: skip
    return out


def find_unit(cfg: ExperimentConfig, which: str) -> Unit:
    """The unit named ``which``: its key or its index in :func:`units`."""
    grid = units(cfg)
    if which.isdigit() and int(which) < len(grid):
        return grid[int(which)]
    for unit in grid:
        if unit.key == which:
            return unit
    raise ValueError(f"no unit {which!r} in experiment {cfg.name!r}: `envace experiment --list` shows them")


def result_path(cfg: ExperimentConfig, unit: Unit) -> Path:
    return cfg.results_dir / "units" / f"{unit.key}.json"


def is_done(cfg: ExperimentConfig, unit: Unit) -> bool:
    return result_path(cfg, unit).is_file()


def write_result(cfg: ExperimentConfig, unit: Unit, result: dict[str, Any]) -> Path:
    """Write a unit's result file atomically: a crash leaves the old state, never half a file."""
    path = result_path(cfg, unit)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
