"""`envace experiment` on ShopWorld (``evaluation.benchmark: shopworld``): a tiny grid runs from the
ShopWorld config, evaluates every policy on test tasks scored by gold-writes with decision-relevant
fidelity, and judges the study's declared hypotheses (studies/shopworld/hypotheses.yaml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_tiny_shopworld_grid_runs_evaluates_and_judges_the_declared_hypotheses(tmp_path: Path) -> None:
    config = {
        "name": "tiny_shopworld", "base": str(ROOT / "configs/shopworld.yaml"), "arms": ["real_env"], "seeds": [0],
        "reference_arm": "real_env",
        "warm_start_steps": 2, "rl_steps": 1, "val_every": 0, "results": str(tmp_path / "results"),
        "work": str(tmp_path / "work"), "hypotheses": str(ROOT / "studies/shopworld/hypotheses.yaml"),
        "fit_args": ["--model.init_args.policy.name_or_path", "tiny", "--data.limit", "8", "--data.tasks_per_step",
                     "2", "--model.init_args.group_size", "2", "--trainer.precision", "32-true",
                     "--model.init_args.limits.max_new_tokens", "16", "--model.init_args.limits.max_rehearse_tokens",
                     "16"],
        "evaluation": {"benchmark": "shopworld", "splits": ["test"], "tasks_per_split": 10, "n_values": [0],
                       "max_prompt_tokens": None, "limits": {"max_new_tokens": 16, "max_rehearse_tokens": 16}},
    }  # fmt: skip
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    for args in (["--config", str(path)], ["report", str(tmp_path / "results")]):
        done = subprocess.run([sys.executable, "-m", "envace.cli", "experiment", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    units = tmp_path / "results" / "units"
    ws = json.loads((units / "eval-warm_start.json").read_text())
    assert len(ws["items"]) == 10 and {it["split"] for it in ws["items"]} == {"test"}
    assert {it["task_id"].split("-")[3] for it in ws["items"]} == {"S1_copy", "S2_cheaper", "S3_fallback",
                                                                   "S4_carry", "S5_control"}  # fmt: skip
    assert all("decision_f1" in row for row in ws["fidelity"]) and (units / "eval-real_env-s0.json").exists()
    report = (tmp_path / "results" / "report.md").read_text()
    assert "sanity" in report and "H1" in report and "not tested (arm envace not in the grid)" in report
