"""``envace experiment``: the paper's comparison as a resumable grid of units, and its report.

    envace experiment --config studies/bfcl_arms/bfcl_cpu.yaml            # run what is not done, then report
    envace experiment --config studies/bfcl_arms/bfcl_cpu.yaml --list     # the units and their status
    envace experiment --config studies/bfcl_arms/bfcl_cpu.yaml --unit 3   # one unit (a scheduler's array task)
    envace experiment --config studies/bfcl_arms/bfcl_cpu.yaml --unit eval-warm_start --add-fidelity call
    envace experiment --config studies/bfcl_arms/bfcl_cpu_v2.yaml --release  # the finished policies not yet released
    envace experiment report studies/bfcl_arms/bfcl_cpu                      # the report from the result files

The grid (:mod:`~envace.experiment.grid`): one grounded warm start shared by every arm, arms × seeds
of ordinary ``envace fit`` runs from it, and an evaluation of every policy (:mod:`~envace.experiment.evaluate`).
Every finished unit writes a small result file in the results folder (kept in the repository);
checkpoints and logs live in the work folder (the cache). A second invocation skips what is done.
A grid with ``policies_from`` evaluates another experiment's policies, under ``evaluation.drift``
(``studies/bfcl_arms/bfcl_cpu_drift.yaml``); its report is :mod:`~envace.experiment.drift_report`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from envace.experiment.evalspec import EvalSpec
from envace.experiment.grid import ExperimentConfig, Unit, find_unit, load_config, units

__all__ = ["EvalSpec", "ExperimentConfig", "Unit", "load_config", "main", "units"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``envace experiment``."""
    from envace.commands.usage import command_parser

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "report":
        from envace.experiment.report import write_report

        reporting = command_parser("envace experiment report", "The report of a grid, from its result files only.")
        reporting.add_argument("results", metavar="FOLDER", help="the grid's results folder (its config's results:)")
        reporting.add_argument(
            "--n_boot",
            type=int,
            default=2000,
            help="bootstrap replicates per interval (a study's rules may declare more)",
        )
        read = reporting.parse_args(args[1:])
        print(write_report(Path(read.results), read.n_boot))
        return 0
    parser = command_parser("envace experiment", __doc__ or "")
    parser.add_argument("--config", required=True, help="the experiment config (studies/<study>/*.yaml)")
    parser.add_argument("--list", action="store_true", help="print the units and their status, run nothing")
    parser.add_argument("--unit", help="run one unit (its key or index in --list), here, then stop")
    add_help = "with --unit: add the gold fidelity of that layout (call, turn) to the finished evaluation unit"
    parser.add_argument("--add-fidelity", metavar="LAYOUT", help=add_help)
    parser.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    release_help = "release the finished policies of release_seeds (--unit: that one) not yet released; run nothing"
    parser.add_argument("--release", action="store_true", help=release_help)
    opts = parser.parse_args(args)
    cfg = load_config(opts.config)
    from envace.experiment import runner

    if opts.list:
        from envace.experiment.status import listing

        print(listing(cfg))
        return 0
    if opts.add_fidelity is not None:
        from envace.experiment.add_fidelity import add_fidelity

        if opts.unit is None:
            parser.error("--add-fidelity needs --unit (the evaluation unit to add to)")
        unit = find_unit(cfg, opts.unit)
        print(f"[{cfg.name}] {unit.key}: {add_fidelity(cfg, unit, opts.add_fidelity)}", flush=True)
        return 0
    _write_metadata(cfg)
    if opts.release:
        return _release(cfg, opts.config, None if opts.unit is None else find_unit(cfg, opts.unit).key)
    if opts.unit is not None:
        unit = find_unit(cfg, opts.unit)
        print(f"[{cfg.name}] {unit.key}: {runner.run_unit(cfg, unit, opts.config)}", flush=True)
        return 0
    failed = runner.run_grid(cfg, opts.config, show=lambda line: print(line, flush=True))
    if not opts.no_report and not failed and not os.environ.get("ENVACE_EXPERIMENT_CHILD"):
        from envace.experiment.report import write_report

        print(f"[{cfg.name}] report: {write_report(cfg.results_dir)}")
    return 1 if failed else 0


def _release(cfg: ExperimentConfig, config: str, only: str | None = None) -> int:
    """``--release [--unit K]``: each finished unit of ``release_seeds`` (or only ``K``) not yet released,
    or whose released folder is not on this machine (or not as recorded), from its checkpoint (restored,
    or fitted again and checked against its result file, where the work folder lost it); a folder made
    again must hold the checksums its committed record names."""
    from envace.experiment import release, runner
    from envace.experiment.machine import pin_numerics

    chosen = [u for u in release.released(cfg) if only in (None, u.key)]
    if not chosen:
        raise ValueError(f"{cfg.name}: {only or 'no unit'} is not released (release_seeds: {cfg.release_seeds})")
    pin_numerics(cfg)
    for unit in chosen:
        fingerprint = release.recorded_fingerprint(cfg, unit)
        record = release.record_path(cfg, unit)
        if fingerprint is None:
            print(f"[{cfg.name}] {unit.key}: not done", flush=True)
            continue
        sound = release.is_released(cfg, unit) and not release.check_release(release.read_json(record) or {})
        if not sound:
            runner.ensure_checkpoint(cfg, unit)
            release.release_unit(cfg, unit, runner.last_checkpoint(cfg, unit.key), fingerprint, config)
        print(f"[{cfg.name}] {unit.key}: released, {record} ({release.store_dir(fingerprint)})", flush=True)
    return 0


def _write_metadata(cfg: ExperimentConfig) -> None:
    import json

    folder = cfg.results_dir
    folder.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = cfg.metadata()
    if cfg.policies_from is not None:  # whose policies, where its results are, and every task's API classes
        from envace.experiment.evaluate import task_classes
        from envace.experiment.grid import source_config

        source = source_config(cfg)
        meta["policies_from"] = {
            "name": source.name,
            "config": cfg.policies_from,
            "results": os.path.relpath(source.results_dir, folder),
        }
        meta.update(task_classes(source.evaluation))
    (folder / "experiment.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
