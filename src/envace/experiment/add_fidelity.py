"""``envace experiment --unit K --add-fidelity LAYOUT``: a gold layout's fidelity added to an evaluation
unit that already landed, without redoing its items.

The unit's policy checkpoint is found as its evaluation found it (:func:`~envace.experiment.runner.policy_checkpoint`,
restored first where the work folder lost it) and must hold the weights its result file records (an
evaluation's own ``fingerprint``; in files written before evaluations recorded one, the fingerprint of
the unit whose policy it evaluates). The rows come from
:func:`~envace.experiment.evaluate.unit_fidelity`, resumable through the evaluation's parts folder, and
are appended to the result file with their provenance: ``fidelity_added`` lists each added layout,
the code that measured it and its seconds (the unit's own ``seconds`` stay those of its evaluation).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from envace.evaluation.provenance import git_commit
from envace.experiment import runner
from envace.experiment.evaluate import unit_fidelity
from envace.experiment.grid import WARM, ExperimentConfig, Unit, result_path, source_config, units, write_result
from envace.experiment.machine import pin_numerics
from envace.rollout.reference import check_layout


def add_fidelity(cfg: ExperimentConfig, unit: Unit, layout: str) -> Path:
    """Append ``layout``'s gold fidelity to the finished ``eval`` unit's result file; returns its path.

    Raises:
        ValueError: an unknown layout, a unit that is not a finished evaluation (or of a benchmark
            without gold-call fidelity), a layout the file already holds, or a checkpoint with other
            weights than the file records.
    """
    path = result_path(cfg, unit)
    check_layout(layout)
    if unit.kind != "eval" or not path.is_file() or not cfg.evaluation.answers_calls:
        raise ValueError(f"{unit.key}: --add-fidelity adds to a finished evaluation with gold-call fidelity")
    result = json.loads(path.read_text())
    if layout in {row.get("layout", "turn") for row in result["fidelity"]}:
        raise ValueError(f"{unit.key}: its result file already holds gold fidelity in the {layout} layout")
    pin_numerics(cfg)
    grid = {u.key: u for u in units(cfg)}
    for key in unit.needs:
        runner.ensure_checkpoint(cfg, grid[key])
    checkpoint = runner.policy_checkpoint(cfg, unit)
    found, recorded = runner.fingerprint(checkpoint), recorded_weights(cfg, unit, result)
    if found != recorded:
        raise ValueError(
            f"{unit.key}: {checkpoint} holds other weights ({found[:12]}) than its result file records "
            f"({(recorded or 'none')[:12]}); its fidelity would not be of the policy it evaluated"
        )
    began, code = time.perf_counter(), git_commit()  # the code that runs: the checkout may move while it does
    rows = unit_fidelity(cfg, unit, checkpoint, layout, runner.eval_parts(cfg, unit, found))
    added = {"layout": layout, "code": code, "seconds": round(time.perf_counter() - began, 1)}
    result.update(fidelity=[*result["fidelity"], *rows], fidelity_added=[*result.get("fidelity_added", []), added])
    return write_result(cfg, unit, result)


def recorded_weights(cfg: ExperimentConfig, unit: Unit, result: dict[str, Any]) -> str | None:
    """The fingerprint of the weights an evaluation's result file is of: its own, else (files written
    before evaluations recorded one) that of the unit whose policy it evaluated, in this grid or in
    the one ``policies_from`` names."""
    if result.get("fingerprint"):
        return str(result["fingerprint"])
    source = cfg if cfg.policies_from is None else source_config(cfg)
    key = unit.needs[0] if cfg.policies_from is None else WARM if unit.arm == WARM else f"run-{unit.arm}-s{unit.seed}"
    trained = next(u for u in units(source) if u.key == key)
    recorded = json.loads(result_path(source, trained).read_text()).get("fingerprint")
    return None if recorded is None else str(recorded)
