"""Running the units of an experiment: each ``fit`` an ordinary ``envace fit`` in its own process, each
evaluation in its own process, every finished unit's result file written at once.

The grid is resumable at two levels: a unit whose result file exists is skipped, and a ``fit``
interrupted mid-way resumes from its own ``last.ckpt`` (checkpoints live in the work folder, outside
the repository). ``--unit K`` runs one unit, so a scheduler can run units on many machines (a unit
only needs the result of the units it starts from, see :class:`~envace.experiment.grid.Unit`).
A grid with ``policies_from`` trains nothing: its evaluations read the other experiment's
checkpoints, each checked against the weights that experiment's result file records.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from envace.evaluation.provenance import git_commit
from envace.experiment.grid import (
    WARM,
    ExperimentConfig,
    Unit,
    is_done,
    result_path,
    source_config,
    units,
    write_result,
)
from envace.experiment.machine import machine, pin_numerics
from envace.experiment.release import release_unit, released
from envace.experiment.status import progress


def unit_dir(cfg: ExperimentConfig, unit: Unit) -> Path:
    """The unit's work folder: the fit's events (``fit/``) and checkpoints (``fit/checkpoints``)."""
    return cfg.work_dir / unit.key


def last_checkpoint(cfg: ExperimentConfig, key: str) -> Path:
    return cfg.work_dir / key / "fit" / "checkpoints" / "last.ckpt"


def fit_args(cfg: ExperimentConfig, unit: Unit) -> list[str]:
    """The ``envace fit`` arguments of a ``warm_start`` or ``run`` unit (configs first, then overrides)."""
    configs, variant = ["--config", cfg.base], list[str]()
    if unit.kind == "run":
        overlay, variant = cfg.run_args(unit.arm)
        configs += ["--config", str(cfg.arm_config(overlay))]
    out = [
        *configs,
        *cfg.fit_args,
        *variant,
        "--trainer.logger.init_args.save_dir",
        str(cfg.work_dir),
        "--trainer.logger.init_args.name",
        unit.key,
        "--trainer.logger.init_args.version",
        "fit",
    ]
    if unit.kind == "warm_start":
        steps = str(cfg.warm_start_steps)
        return out + [
            "--model.init_args.warm_start_steps",
            steps,
            "--trainer.max_steps",
            steps,
            "--trainer.limit_val_batches",
            "0",
            "--trainer.num_sanity_val_steps",
            "0",
        ]
    out += [
        "--seed_everything",
        str(unit.seed),
        "--trainer.max_steps",
        str(cfg.rl_steps),
        "--model.init_args.policy.checkpoint",
        str(last_checkpoint(cfg, "warm_start")),
        "--model.init_args.warm_start_steps",
        "0",
    ]
    if cfg.val_every:
        return out + ["--trainer.val_check_interval", str(cfg.val_every)]
    return out + ["--trainer.limit_val_batches", "0", "--trainer.num_sanity_val_steps", "0"]


def check_checkpoints(cfg: ExperimentConfig, unit: Unit) -> None:
    """A unit's fit config (base, overlay, ``fit_args``, variant, read as ``envace fit`` reads them) must
    let its checkpoints follow its logger (no ``ModelCheckpoint`` ``dirpath``): else every unit would
    write the same folder."""
    from envace.commands.fit_config import load_fit_config

    for cb in load_fit_config(fit_args(cfg, unit)).trainer.callbacks or []:
        if str(cb.class_path).endswith("ModelCheckpoint") and cb.init_args.dirpath:
            raise ValueError(
                f"{unit.key}: ModelCheckpoint sets dirpath {cb.init_args.dirpath}; an experiment's fit "
                "configs must not (each unit's checkpoints go to its own folder)"
            )


def run_fit(cfg: ExperimentConfig, unit: Unit) -> None:
    """Run (or resume) the unit's fit to its last step."""
    check_checkpoints(cfg, unit)
    args = ["fit", *fit_args(cfg, unit)]
    last = last_checkpoint(cfg, unit.key)
    if last.is_file():
        args += ["--ckpt_path", str(last)]
    log = unit_dir(cfg, unit) / "fit.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with attempt(cfg, unit, log), log.open("a") as out:
        rc = subprocess.run(
            [sys.executable, "-m", "envace.cli", *args], stdout=out, stderr=subprocess.STDOUT
        ).returncode
    if rc != 0:
        raise RuntimeError(f"{unit.key}: envace fit exited with {rc}; its output is in {log}")


#: in a unit's work folder while its fit or evaluation runs: the attempt's start (epoch seconds)
OPEN_ATTEMPT = "attempt.open"


@contextmanager
def attempt(cfg: ExperimentConfig, unit: Unit, log: Path) -> Iterator[None]:
    """One attempt at a unit: an earlier attempt killed with its runner is counted first
    (:func:`_close_killed_attempt`, up to the last change of ``log``), this one's start is kept in the
    work folder while it runs, and its seconds are added when it returns."""
    _close_killed_attempt(cfg, unit, log)
    opened = unit_dir(cfg, unit) / OPEN_ATTEMPT
    opened.write_text(str(time.time()))
    began = time.perf_counter()
    yield
    _add_seconds(cfg, unit, time.perf_counter() - began)
    opened.unlink()


def _close_killed_attempt(cfg: ExperimentConfig, unit: Unit, log: Path) -> None:
    """An attempt killed with its runner (the machine stopped, the grid was killed) left its start
    behind and no seconds: it cost from that start to the last change of ``log`` (a fit's last line in
    ``fit.log``; an evaluation's last finished part in its parts folder), which is added."""
    opened = unit_dir(cfg, unit) / OPEN_ATTEMPT
    if not opened.is_file():
        return
    began = float(opened.read_text())
    ended = log.stat().st_mtime if log.is_file() else began
    seconds = max(0.0, ended - began)
    print(f"[{cfg.name}] {unit.key}: an earlier attempt was killed after {seconds:.0f} s; counted", flush=True)
    _add_seconds(cfg, unit, seconds)
    opened.unlink()


def _add_seconds(cfg: ExperimentConfig, unit: Unit, seconds: float) -> None:
    """Keep every attempt's wall time (a resumed unit costs all its attempts)."""
    path = unit_dir(cfg, unit) / "attempts.json"
    attempts = json.loads(path.read_text()) if path.is_file() else []
    path.write_text(json.dumps([*attempts, round(seconds, 1)]))


def spent_seconds(cfg: ExperimentConfig, unit: Unit) -> float:
    path = unit_dir(cfg, unit) / "attempts.json"
    return float(sum(json.loads(path.read_text()))) if path.is_file() else 0.0


def eval_parts(cfg: ExperimentConfig, unit: Unit, weights: str) -> Path:
    """An evaluation's finished parts, kept per weights (``weights``: their fingerprint): an attempt resumes."""
    return unit_dir(cfg, unit) / "eval-parts" / weights[:16]


def fingerprint(checkpoint: Path) -> str:
    """SHA-256 of a checkpoint's policy weights (names and bytes, in name order)."""
    import torch

    from envace.policy import read_checkpoint

    state = read_checkpoint(str(checkpoint))["state_dict"]
    digest = hashlib.sha256()
    for name in sorted(k for k in state if k.startswith("policy.")):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def event_scalars(folder: Path) -> dict[str, list[list[float]]]:
    """Every scalar of the event files under ``folder``, ``tag -> [[step, value], ...]`` by step; where a
    resumed fit logged a step again, its last logged value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    latest: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for f in sorted(folder.rglob("events.out.tfevents*")):
        ea = EventAccumulator(str(f), size_guidance={"scalars": 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            for e in ea.Scalars(tag):
                seen = latest[tag].get(e.step)
                if seen is None or e.wall_time >= seen[0]:
                    latest[tag][e.step] = (e.wall_time, e.value)
    return {tag: [[step, value] for step, (_, value) in sorted(by_step.items())] for tag, by_step in latest.items()}


def fit_result(cfg: ExperimentConfig, unit: Unit) -> dict[str, Any]:
    """A finished fit's result file: its seconds, steps, cost (``cost/*`` summed), and its ``val/*``
    and ``train/*`` curves (the training scalars explain a run's validation curves: reward, groups
    with reward variance, KL to the warm start, clip fraction, format errors, ...)."""
    last = last_checkpoint(cfg, unit.key)
    if not last.is_file():
        raise RuntimeError(f"{unit.key}: the fit left no checkpoint at {last}")
    from envace.policy import read_checkpoint

    steps = int(read_checkpoint(str(last)).get("global_step", 0))
    planned = cfg.warm_start_steps if unit.kind == "warm_start" else cfg.rl_steps
    if steps != planned:  # a result must be of the weights the unit declares, never of an earlier step's
        raise RuntimeError(f"{unit.key}: the fit's last checkpoint is at step {steps}, not the {planned} it ran to")
    base = {
        "unit": unit.key,
        "kind": unit.kind,
        "seconds": round(spent_seconds(cfg, unit), 1),
        "steps": steps,
        "fingerprint": fingerprint(last),
    }
    if unit.kind == "warm_start":
        return base
    scalars = event_scalars(unit_dir(cfg, unit) / "fit")
    cost = {
        k: int(sum(v for _, v in scalars.get(f"cost/{k}", []))) for k in ("act_tokens", "rehearse_tokens", "env_calls")
    }
    cost["generated_tokens"] = cost["act_tokens"] + cost["rehearse_tokens"]
    curves = {t: v for t, v in scalars.items() if t.startswith(("val/committed/", "val/imagined/", "train/"))}
    return {**base, "arm": unit.arm, "seed": unit.seed, "cost": cost, "curves": curves}


def run_unit(cfg: ExperimentConfig, unit: Unit, config: str) -> Path:
    """Run one unit here and write its result file (after the units it needs have theirs); ``config``:
    the grid's config file, which a released unit's record names (:mod:`~envace.experiment.release`)."""
    grid = {u.key: u for u in units(cfg)}
    missing = [k for k in unit.needs if not is_done(cfg, grid[k])]
    if missing:
        raise ValueError(f"unit {unit.key} starts from {', '.join(missing)}: run that first")
    pin_numerics(cfg)
    code = git_commit()  # the code that runs, read before it runs: the checkout may move while a unit does
    for key in unit.needs:
        ensure_checkpoint(cfg, grid[key])
    if unit.kind == "eval":
        from envace.experiment.evaluate import evaluate_unit

        checkpoint = policy_checkpoint(cfg, unit)
        weights = fingerprint(checkpoint)
        parts = eval_parts(cfg, unit, weights)
        parts.mkdir(parents=True, exist_ok=True)
        with attempt(cfg, unit, parts):  # a killed attempt cost until its last part
            result = evaluate_unit(cfg, unit, checkpoint, parts)
        result.update(seconds=round(spent_seconds(cfg, unit), 1), fingerprint=weights)
        return write_result(cfg, unit, {**result, "code": code, "machine": machine()})
    run_fit(cfg, unit)
    if unit.kind == "warm_start":
        keep_policy(cfg, unit)
    result = {**fit_result(cfg, unit), "code": code, "machine": machine()}
    if unit in released(cfg):  # before its result file: a unit done is a unit released
        release_unit(cfg, unit, last_checkpoint(cfg, unit.key), result["fingerprint"], config)
    return write_result(cfg, unit, result)


def kept_policy(cfg: ExperimentConfig, unit: Unit) -> Path:
    """The copy of a finished warm start's policy weights beside the result files (committed with them)."""
    return cfg.results_dir / "checkpoints" / f"{unit.key}.ckpt"


def keep_policy(cfg: ExperimentConfig, unit: Unit) -> Path:
    """Write the warm start's policy weights where the result files are, to be committed with them.

    Every run and evaluation of the grid starts from the warm start, and a grid spans sessions whose
    machines differ: run again on another CPU (other kernels), the same fit gives other weights, so the
    checkpoint cannot be rebuilt, only restored. The copy holds what a fit or an evaluation reads: the
    policy's trainable weights (LoRA: a few MB), its spec and step; no optimizer, no frozen copies.
    """
    import torch

    from envace.policy import read_checkpoint

    ckpt = read_checkpoint(str(last_checkpoint(cfg, unit.key)))
    kept: dict[str, Any] = {
        "state_dict": {k: v for k, v in ckpt["state_dict"].items() if k.startswith("policy.")},
        **{k: ckpt[k] for k in ("envace", "global_step", "epoch") if k in ckpt},
    }
    path = kept_policy(cfg, unit)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".ckpt.tmp")
    torch.save(kept, tmp)
    tmp.replace(path)
    return path


def ensure_checkpoint(cfg: ExperimentConfig, unit: Unit) -> None:
    """The finished ``unit``'s checkpoint, which the units after it start from, holding the weights its
    result file records (else the grid would mix two versions of it, and it stops). When it is missing
    (a fresh machine, a cleaned cache), it is restored from the copy :func:`keep_policy` left with the
    result files; without one, its fit runs again, after the checkpoints it starts from are ensured in
    turn. A rerun killed mid-way resumes; one that gives other weights is moved aside, not used."""
    last, kept = last_checkpoint(cfg, unit.key), kept_policy(cfg, unit)
    recorded = json.loads(result_path(cfg, unit).read_text()).get("fingerprint")
    if last.is_file() and not (unit_dir(cfg, unit) / OPEN_ATTEMPT).is_file():
        _check_weights(unit, last, recorded, "holds other weights")
        if unit.kind == "warm_start" and not kept.is_file():  # a grid begun before copies were kept
            keep_policy(cfg, unit)
        return
    if kept.is_file():
        _check_weights(unit, kept, recorded, "holds other weights")
        print(f"[{cfg.name}] {unit.key}: its checkpoint is missing ({last}); restored from {kept}", flush=True)
        last.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept, last)
        return
    grid = {u.key: u for u in units(cfg)}
    for key in unit.needs:
        ensure_checkpoint(cfg, grid[key])
    print(f"[{cfg.name}] {unit.key}: its checkpoint is missing ({last}); running its fit again", flush=True)
    run_fit(cfg, unit)
    try:
        _check_weights(unit, last, recorded, "(its fit run again) gives other weights")
    except ValueError as e:
        aside = last.with_name("rerun-other-weights.ckpt")
        last.replace(aside)
        raise ValueError(
            f"{e}; the rerun's checkpoint is {aside}: restore the recorded one, or rerun what starts from it"
        ) from None


def _check_weights(unit: Unit, checkpoint: Path, recorded: str | None, why: str) -> None:
    found = fingerprint(checkpoint)
    if recorded is not None and found != recorded:
        raise ValueError(f"{unit.key}: {checkpoint} {why} ({found[:12]}; its result file records {recorded[:12]})")


def policy_checkpoint(cfg: ExperimentConfig, unit: Unit) -> Path:
    """The checkpoint an ``eval`` unit evaluates: the warm start's, or its run's final one (with
    ``policies_from``, the other experiment's: :func:`source_checkpoint`)."""
    if cfg.policies_from is not None:
        return source_checkpoint(cfg, unit)
    return last_checkpoint(cfg, unit.needs[0])


def source_checkpoint(cfg: ExperimentConfig, unit: Unit) -> Path:
    """The other experiment's checkpoint of ``unit``'s policy, once that experiment has finished its
    unit, and only when it holds the weights that unit's result file records: this grid never trains,
    so a missing or changed checkpoint stops it with a one-line error."""
    source = source_config(cfg)
    key = WARM if unit.arm == WARM else f"run-{unit.arm}-s{unit.seed}"
    trained = next(u for u in units(source) if u.key == key)
    if not is_done(source, trained):
        raise ValueError(
            f"{unit.key} evaluates {key} of experiment {source.name}, which has not finished it: "
            f"run that grid first ({cfg.policies_from})"
        )
    checkpoint = last_checkpoint(source, key)
    if not checkpoint.is_file():
        raise ValueError(
            f"{unit.key}: the checkpoint of {source.name}'s {key} is missing ({checkpoint}); restore "
            "it: this grid evaluates that experiment's policies and trains nothing"
        )
    recorded = json.loads(result_path(source, trained).read_text()).get("fingerprint")
    found = fingerprint(checkpoint)
    if recorded is not None and found != recorded:
        raise ValueError(
            f"{unit.key}: {checkpoint} holds other weights ({found[:12]}) than {source.name}'s result "
            f"file of {key} records ({recorded[:12]})"
        )
    return checkpoint


def run_grid(cfg: ExperimentConfig, config_path: str, show: Any = print) -> list[Unit]:
    """Run every unit not yet done, each in its own process (``envace experiment --unit``), showing
    the grid's progress as it goes; returns the units that failed (the others went on)."""
    grid = units(cfg)
    times: dict[str, list[float]] = defaultdict(list)
    failed: list[Unit] = []
    show(progress(cfg, grid, None, times))
    for unit in grid:
        if is_done(cfg, unit):
            continue
        if any(f.key in unit.needs for f in failed):
            failed.append(unit)
            continue
        show(progress(cfg, grid, unit, times))
        began = time.perf_counter()
        cmd = [sys.executable, "-m", "envace.cli", "experiment", "--config", config_path, "--unit", unit.key]
        rc = subprocess.run(cmd, env={**os.environ, "ENVACE_EXPERIMENT_CHILD": "1"}).returncode
        times[unit.kind].append(time.perf_counter() - began)
        if rc != 0 or not is_done(cfg, unit):
            failed.append(unit)
            show(f"  {unit.key} FAILED (exit {rc}); the grid goes on with the units that do not need it")
    show(progress(cfg, grid, None, times))
    return failed
