"""The report's section by stratum (:mod:`envace.experiment.strata`) on the synthetic grid of
tests/experiment/test_report.py, its tasks renamed into ShopWorld's strata (task ``tNN`` into stratum
``NN mod 5``), so that every cell can be worked out by hand from the grid's rule: task NN of an arm of
rate r succeeds for seed s iff (NN + s) mod 10 < 10·r."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from envace.experiment.report import load_results, render_report
from envace.experiment.strata import KNOWN_STRATA

_spec = importlib.util.spec_from_file_location("synthetic_grid", Path(__file__).with_name("test_report.py"))
assert _spec and _spec.loader
_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grid)


def _as_strata(folder: Path) -> Path:
    for file in (folder / "units").glob("eval-*.json"):
        unit = json.loads(file.read_text())
        for row in unit["items"] + unit["fidelity"]:
            i = int(row["task_id"][1:])
            row["task_id"] = f"shopworld-x-{i:04d}-{KNOWN_STRATA[i % 5]}"
        file.write_text(json.dumps(unit))
    return folder


def _row(text: str, first_cell: str, table: str = "| policy |") -> list[str]:
    """A row's cells but the first, of the section's table whose header starts with ``table``."""
    section = text.split("## By stratum")[1].split("\n## ")[0]
    section = section[section.index(table) :]
    line = next(line for line in section.splitlines() if line.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_each_stratum_is_read_apart_with_every_seeds_own_difference(tmp_path: Path) -> None:
    folder = _as_strata(_grid.make_grid(tmp_path / "exp", arms=("envace", "real_env")))
    text = render_report(load_results(folder), n_boot=200)
    # the warm start (rate 0.3, seed 0) passes t00-t02: S1 holds t00 (pass) and t05 (fail) in each split
    assert _row(text, "warm start")[0].startswith("0.500 [")
    # real_env (rate 0.2): seed 0 passes t00, t01; seed 1 passes t09, t00. Against the warm start:
    # S2 (t01, t06): s0 as the warm start, s1 loses t01; S5 (t04, t09): s1 gains t09
    diffs = _row(text, "real_env", "| arm − warm start |")
    assert diffs[1].endswith("(s0 +0.00, s1 -0.50)") and diffs[1].startswith("-0.250 [")
    assert diffs[4].endswith("(s0 +0.00, s1 +0.50)")
    assert text.index("## By stratum") < text.index("## Verdicts")


def test_a_grid_whose_tasks_name_no_stratum_has_no_such_section(tmp_path: Path) -> None:
    assert "## By stratum" not in render_report(load_results(_grid.make_grid(tmp_path / "exp")), n_boot=50)
