"""`envace experiment` on BFCL single-turn (``evaluation.benchmark: bfcl-single``): an eval unit scores each
held-out item with bfcl-eval's ast_checker and labels it ``test:<category>``, so that a tiny grid's report
gives every category and the pooled figure, with the warm start and each arm's difference to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from envace.experiment.evalspec import EvalSpec
from envace.experiment.evaluate import evaluate_unit
from envace.experiment.grid import ExperimentConfig, find_unit

ROOT = Path(__file__).resolve().parents[2]
BASE = str(ROOT / "configs/bfcl_single.yaml")
CATEGORIES = ["simple_python", "multiple", "live_simple"]


def test_bfcl_single_needs_single_turn_categories_with_a_split() -> None:
    with pytest.raises(ValueError, match="bfcl-single needs single-turn categories .*multi_turn_base"):
        EvalSpec("bfcl-single", ["test"])  # the default categories are BFCL multi-turn's
    with pytest.raises(ValueError, match="irrelevance"):
        EvalSpec("bfcl-single", ["test"], ["simple_python", "irrelevance"])


def test_an_eval_unit_scores_every_item_by_the_checker_and_labels_its_category() -> None:
    spec = EvalSpec("bfcl-single", ["test"], CATEGORIES, tasks_per_split=6, n_values=[0], max_prompt_tokens=None)
    cfg = ExperimentConfig("tiny", BASE, ["real_env"], reference_arm="real_env", evaluation=spec)
    strata = ["test:simple_python", "test:multiple", "test:live_simple"]
    assert cfg.metadata()["splits"] == spec.strata() == strata  # the report's columns
    unit = find_unit(cfg, "eval-warm_start")
    for policy, passed in (("oracle", True), ("noop", False)):
        out = evaluate_unit(cfg, unit, Path(policy))
        items = out["items"]
        assert len(items) == 6 and {it["split"] for it in items} == set(strata)
        assert all(it["split"] == f"test:{it['task_id'].rsplit('_', 1)[0]}" for it in items)
        assert [(it["success"], it["turn_score"]) for it in items] == [(passed, float(passed))] * 6
        assert out["fidelity"] == []  # nothing answers a single-turn call: no gold-call fidelity


def test_an_eval_unit_in_chunks_gives_the_items_of_one_part_per_split(tmp_path: Path) -> None:
    """The real ``evaluate`` on chunks of four of the six items (``evaluation.part_tasks``), each kept as a
    part: the items, in order, of one part per split."""
    import dataclasses

    spec = EvalSpec("bfcl-single", ["test"], CATEGORIES, tasks_per_split=6, n_values=[0], max_prompt_tokens=None)
    spec = dataclasses.replace(spec, part_tasks=4)
    cfg = ExperimentConfig("tiny", BASE, ["real_env"], reference_arm="real_env", evaluation=spec)
    whole = dataclasses.replace(cfg, evaluation=dataclasses.replace(spec, part_tasks=None))
    unit = find_unit(cfg, "eval-warm_start")
    chunked = evaluate_unit(cfg, unit, Path("oracle"), tmp_path / "chunked")
    assert len(list((tmp_path / "chunked").glob("test-items-*-tasks*.json"))) == 2
    assert chunked["items"] == evaluate_unit(whole, unit, Path("oracle"), tmp_path / "whole")["items"]


@pytest.mark.slow
def test_a_tiny_bfcl_single_grid_reports_each_category_and_the_pool(tmp_path: Path) -> None:
    config = {
        "name": "tiny_bfcl_single", "base": BASE, "arms": ["real_env"], "seeds": [0], "reference_arm": "real_env",
        "warm_start_steps": 2, "rl_steps": 1, "val_every": 0, "results": str(tmp_path / "results"),
        "work": str(tmp_path / "work"),
        "fit_args": ["--model.init_args.policy.name_or_path", "tiny", "--data.limit", "8", "--data.tasks_per_step",
                     "2", "--model.init_args.group_size", "2", "--trainer.precision", "32-true", "--data.val_tasks",
                     "2", "--model.init_args.limits.max_new_tokens", "16"],
        "evaluation": {"benchmark": "bfcl-single", "splits": ["test"], "categories": CATEGORIES,
                       "tasks_per_split": 6, "n_values": [0], "max_prompt_tokens": None,
                       "limits": {"max_new_tokens": 16}},
    }  # fmt: skip
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    for args in (["--config", str(path)], ["report", str(tmp_path / "results")]):
        done = subprocess.run([sys.executable, "-m", "envace.cli", "experiment", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    units = tmp_path / "results" / "units"
    for key in ("eval-warm_start", "eval-real_env-s0"):
        items = json.loads((units / f"{key}.json").read_text())["items"]
        assert sorted({it["split"] for it in items}) == ["test:live_simple", "test:multiple", "test:simple_python"]
    report = (tmp_path / "results" / "report.md").read_text()
    header = "| policy | success test:simple_python | success test:multiple | success test:live_simple |"
    assert header + " turn score (pooled) |" in report  # each category, then the pooled turn score
    assert header + " success pooled | tasks (pooled) |" in report  # the differences, per category and pooled
    assert "| real_env | " in report.split("### Difference to the warm start")[1]
    assert "test:simple_python (3), test:multiple (2), test:live_simple (1)" in report  # the evaluated items
