"""What an experiment is: its configuration and its units (the warm start, the runs, their evaluations).

A unit is the smallest piece of work that leaves a result file: ``warm_start`` (the grounded warm
start every arm starts from), ``eval-warm_start``, and for each seed and arm ``run-<arm>-s<seed>``
(an ordinary ``envace fit`` from the warm start) then ``eval-<arm>-s<seed>``. Units are ordered so
that a partly run grid holds whole seeds: every arm of seed 0 before any of seed 1.

Two optional axes of the evaluation: ``evaluation.drift`` evaluates every policy once per drift of
the real environment (``eval-<policy>-<drift>``, docs/drift.md), and ``policies_from`` makes a grid
that trains nothing: it evaluates another experiment's policies (its warm start and runs, from its
work folder), one drift after another, each drift's policies together.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import yaml

from envace.experiment.evalspec import EvalSpec, drift_entries, setting_label
from envace.paths import cache_dir
from envace.types import UsageError

KINDS = ("warm_start", "run", "eval")
WARM = "warm_start"
#: further settings of a run: ``envace fit`` arguments (``[--model.init_args.rl_lr_scale, "0.05"]``), or a
#: YAML overlay of the fit config, shaped as ``configs/arms/*.yaml`` (``{model: {init_args: {rl_lr_scale: 0.05}}}``)
Overlay: TypeAlias = list[str] | dict[str, Any]


def overlay_args(overlay: Overlay) -> list[str]:
    """An overlay as ``envace fit`` arguments: a list as it is, a mapping as one ``--config`` holding its
    YAML (the fit's parser reads a config given inline as it reads a file).

    >>> overlay_args(["--a", "1"]), overlay_args({"model": {"init_args": {"rl_lr_scale": 0.05}}})
    (['--a', '1'], ['--config', '{model: {init_args: {rl_lr_scale: 0.05}}}'])
    """
    if isinstance(overlay, dict):
        return ["--config", yaml.safe_dump(overlay, default_flow_style=True, sort_keys=False).strip()]
    return list(overlay)


def _check_overlay(where: str, overlay: Any) -> None:
    """``overlay`` is a list of strings or a mapping of the fit config's sections (one line naming it, else)."""
    if isinstance(overlay, list) and all(isinstance(a, str) for a in overlay):
        return
    if isinstance(overlay, dict) and overlay and all(isinstance(k, str) for k in overlay):
        return
    raise ValueError(f"{where}: expected a list of envace fit arguments or a mapping overlay of the fit config "
                     f"(as configs/arms/*.yaml), got {overlay!r}")  # fmt: skip


@dataclass
class ExperimentConfig:
    """An experiment: one warm start, arms × seeds of RL runs from it, every policy evaluated.

    Args:
        name: the experiment's name (its folders are named after it).
        base: the fit config every unit runs (``configs/bfcl.yaml``): data, model, limits, sampling.
        arms: overlays of ``configs/arms/`` (``envace``, ``real_env``, ``simulator``, ``sft_only``, ...),
            each optionally ``<overlay>+<variant>``: the overlay with a variant's arguments (a recipe search).
        seeds: seeds of every arm's run (``seed_everything``).
        warm_start_steps: grounded supervised steps of the shared warm start.
        rl_steps: optimizer steps of every run after the warm start (``sft_only``: supervised steps).
        val_every: validation interval of the runs (their ``val/*`` curves; 0: none).
        fit_args: further ``envace fit`` arguments for every fit (``--data.val_tasks 8``, ...).
        results: the folder of the result files and the report (small files, kept in the repository).
        work: the folder of checkpoints and logs (default: ``$ENVACE_CACHE/experiments/<name>``).
        evaluation: how every policy is evaluated.
        policies_from: the config of another experiment whose policies this one evaluates (its warm
            start and the final checkpoints of this config's arms × seeds, in its work folder): this
            grid trains nothing and its ``base`` must be that experiment's.
        recipe: further settings of every run (every arm, not the warm start), after ``fit_args``: the RL
            recipe a search chose, so that the warm start stays the one the search started from and the
            arms keep their plain names. An :data:`Overlay`: ``envace fit`` arguments
            (``[--model.init_args.rl_lr_scale, "0.05"]``) or a YAML overlay of the fit config, as
            ``configs/arms/*.yaml`` are (``{model: {init_args: {rl_lr_scale: 0.05}}}``), checked by the
            fit's parser when the config is loaded (:func:`check_overlays`).
        variants: named further settings of the runs (each an :data:`Overlay`, after the recipe), used by
            arms written ``<overlay>+<name>`` (``real_env+lr5e-5``): a recipe search is a grid of such arms.
        reference_arm: the arm every other policy is compared with in the report.
        release_seeds: the seeds whose runs' final policies, and then the warm start's, are released as
            bf16 peft adapter folders in the cache's store, their records beside the result files
            (:mod:`~envace.experiment.release`).
        hypotheses: what the study predicts, judged in the report (:mod:`~envace.experiment.judge`):
            a YAML file of declarations (``studies/bfcl_arms/hypotheses.yaml``) or the list itself.
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
    policies_from: str | None = None
    recipe: Overlay = field(default_factory=list)
    variants: dict[str, Overlay] = field(default_factory=dict)
    reference_arm: str = "envace"
    release_seeds: list[int] = field(default_factory=list)
    hypotheses: str | list[Any] | None = None

    def __post_init__(self) -> None:
        if not self.arms or not self.seeds:
            raise ValueError("an experiment needs at least one arm and one seed")
        _check_overlay("recipe", self.recipe)
        for name, variant in self.variants.items():
            _check_overlay(f"variants.{name}", variant)
        unknown = [a for a in self.arms if "+" in a and a.split("+", 1)[1] not in self.variants]
        if unknown:
            raise ValueError(f"arm {unknown[0]!r} names no variant of {sorted(self.variants)}")
        if self.reference_arm not in self.arms:
            raise ValueError(f"reference_arm {self.reference_arm!r} is not one of the arms {self.arms}")
        if len(set(self.arms)) != len(self.arms) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"arms and seeds must not repeat: {self.arms}, {self.seeds}")
        if self.warm_start_steps < 1 or self.rl_steps < 1:
            raise ValueError("warm_start_steps and rl_steps must be >= 1")
        chosen_seeds = {
            "evaluation.rehearsal_seeds": self.evaluation.rehearsal_seeds,
            "release_seeds": self.release_seeds,
        }
        for what, chosen in chosen_seeds.items():
            stray = sorted(set(chosen or []) - set(self.seeds))
            if stray:
                raise ValueError(f"{what} {stray} are not among the seeds {self.seeds}")

    @property
    def results_dir(self) -> Path:
        return Path(self.results or f"studies/{self.name}")

    @property
    def work_dir(self) -> Path:
        return Path(self.work) if self.work else cache_dir() / "experiments" / self.name

    def run_args(self, arm: str) -> tuple[str, list[str]]:
        """An arm's overlay name and its further ``envace fit`` arguments: the recipe's, then its variant's
        (:func:`overlay_args`).

        >>> ExperimentConfig("x", "b.yaml", ["envace", "real_env+slow"], variants={"slow": ["--a", "1"]},
        ...                  recipe={"model": {"init_args": {"b": 2}}}).run_args("real_env+slow")
        ('real_env', ['--config', '{model: {init_args: {b: 2}}}', '--a', '1'])
        """
        overlay, _, variant = arm.partition("+")
        return overlay, [*overlay_args(self.recipe), *(overlay_args(self.variants[variant]) if variant else [])]

    def arm_config(self, overlay: str) -> Path:
        """The file of an arm's overlay: ``arms/<overlay>.yaml`` beside the base config."""
        return Path(self.base).parent / "arms" / f"{overlay}.yaml"

    def metadata(self) -> dict[str, Any]:
        """``experiment.json``: what the report needs to know of the grid."""
        ev = self.evaluation
        settings = ["none"] + [setting_label(*s) for s in ev.settings() if s[1] > 0]
        meta = {
            "name": self.name,
            "arms": list(self.arms),
            "seeds": list(self.seeds),
            "reference_arm": self.reference_arm,
            "splits": ev.strata(),  # the report's columns: the splits, or bfcl-single's split:category
            "settings": settings,
            "config": asdict(self),
        }
        if ev.drift:
            meta["drift"] = [label for label, _ in drift_entries(ev)]
        if ev.rehearsal_seeds is not None:  # the runs of other seeds hold setting none only
            meta["rehearsal_seeds"] = list(ev.rehearsal_seeds)
        if self.hypotheses is not None:
            from envace.experiment.judge import load

            meta["hypotheses"] = load(self.hypotheses)
        return meta


@dataclass(frozen=True)
class Unit:
    """One piece of work that leaves one result file (``units/<key>.json``).

    Attributes:
        key: ``warm_start``, ``eval-warm_start``, ``run-<arm>-s<seed>`` or ``eval-<arm>-s<seed>``
            (``eval-<policy>-<drift>`` with a drift axis).
        kind: ``warm_start``, ``run`` or ``eval``.
        arm: the run's arm (``warm_start`` for the warm start and its evaluation).
        seed: the run's seed (``None`` for the warm start).
        needs: the keys of the units whose results this one starts from (in this grid).
        drift: the drift label of an ``eval`` unit of a drift axis
            (:func:`~envace.experiment.evalspec.drift_label`), else ``None``.
    """

    key: str
    kind: str
    arm: str
    seed: int | None = None
    needs: tuple[str, ...] = ()
    drift: str | None = None

    @property
    def policy(self) -> str:
        """The name of the policy an ``eval`` unit evaluates (``warm_start`` or ``<arm>-s<seed>``)."""
        return WARM if self.arm == WARM else f"{self.arm}-s{self.seed}"


def _evals(cfg: ExperimentConfig, arm: str, seed: int | None, needs: tuple[str, ...]) -> list[Unit]:
    """The evaluation units of one policy: one, or one per drift."""
    name = WARM if seed is None else f"{arm}-s{seed}"
    drifts = [label for label, _ in drift_entries(cfg.evaluation)]
    if not drifts:
        return [Unit(f"eval-{name}", "eval", arm, seed, needs)]
    return [Unit(f"eval-{name}-{d.replace('/', '-')}", "eval", arm, seed, needs, d) for d in drifts]


def units(cfg: ExperimentConfig) -> list[Unit]:
    """The grid's units, in the order they run (each after the units it needs); with ``policies_from``,
    evaluations only, drift by drift."""
    if cfg.policies_from is not None:
        policies = [(WARM, None)] + [(arm, seed) for seed in cfg.seeds for arm in cfg.arms]
        per_policy = [_evals(cfg, arm, seed, ()) for arm, seed in policies]
        return [evals[i] for i in range(len(per_policy[0])) for evals in per_policy]
    out = [Unit(WARM, WARM, WARM), *_evals(cfg, WARM, None, (WARM,))]
    for seed in cfg.seeds:
        for arm in cfg.arms:
            run = f"run-{arm}-s{seed}"
            out += [Unit(run, "run", arm, seed, (WARM,)), *_evals(cfg, arm, seed, (run,))]
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
    return write_json(result_path(cfg, unit), result)


def write_json(path: Path, data: dict[str, Any]) -> Path:
    """Write ``data`` to ``path`` atomically (a crash leaves the old file, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def load_config(path: str) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from a YAML file; a wrong or unknown field is a one-line error, and
    so is a ``policies_from`` experiment that does not hold this one's policies."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise FileNotFoundError(f"{path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of experiment fields")
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    eval_fields = {f.name for f in dataclasses.fields(EvalSpec)}
    unknown = [f"{k}" for k in raw if k not in fields] + [
        f"evaluation.{k}" for k in (raw.get("evaluation") or {}) if k not in eval_fields
    ]
    if unknown:
        raise ValueError(f"{path}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(fields))})")
    try:
        evaluation = EvalSpec(**(raw.pop("evaluation", None) or {}))
        cfg = ExperimentConfig(**raw, evaluation=evaluation)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if cfg.policies_from is not None:
        check_source(cfg, path)
    else:  # a grid that trains: its runs' overlays must parse
        check_overlays(cfg, path)
    if cfg.hypotheses is not None:
        from envace.experiment.judge import load

        try:
            load(cfg.hypotheses)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
    return cfg


def check_overlays(cfg: ExperimentConfig, path: str) -> None:
    """Every run whose recipe or variant is a mapping overlay, parsed by the fit's own parser
    (:func:`~envace.commands.fit_config.load_fit_config`: the base config, the arm's overlay, ``fit_args``,
    then the run's settings), so a wrong key or value is one line naming it when the config is loaded,
    not when that run starts. Lists of arguments are left to their fits, as before."""
    from envace.commands.fit_config import load_fit_config

    for arm in cfg.arms:
        overlay, _, variant = arm.partition("+")
        if not isinstance(cfg.recipe, dict) and not isinstance(cfg.variants.get(variant), dict):
            continue
        _, args = cfg.run_args(arm)
        try:
            load_fit_config(["--config", cfg.base, "--config", str(cfg.arm_config(overlay)), *cfg.fit_args, *args])
        except UsageError as exc:
            raise ValueError(f"{path}: arm {arm}: the fit's parser refuses its recipe or variant: {exc}") from None


def source_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The experiment whose policies ``cfg`` evaluates (``policies_from``)."""
    assert cfg.policies_from is not None
    return load_config(cfg.policies_from)


def check_source(cfg: ExperimentConfig, path: str) -> None:
    """``cfg``'s policies are in its ``policies_from`` experiment, trained from the same base config."""
    source = source_config(cfg)
    problem = None
    if source.policies_from is not None:
        problem = "evaluates another experiment's policies itself; point at the one that trained them"
    elif not set(cfg.arms) <= set(source.arms) or not set(cfg.seeds) <= set(source.seeds):
        problem = f"has arms {source.arms} and seeds {source.seeds}, not all of {cfg.arms} x {cfg.seeds}"
    elif Path(cfg.base).resolve() != Path(source.base).resolve():
        problem = f"was trained from {source.base}, not this config's base {cfg.base}"
    if problem:
        raise ValueError(f"{path}: policies_from {cfg.policies_from} ({source.name}) {problem}")
