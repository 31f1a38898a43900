"""studies/bfcl_single (issue #51): its grid's fit units and its evaluation config parse, its recipe is the
declared one, and its rules quote the MDD table its script prints."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from envace.experiment import load_config
from envace.experiment.grid import units
from envace.experiment.runner import fit_args

ROOT = Path(__file__).resolve().parents[2]
STUDY = ROOT / "studies" / "bfcl_single"


def _mdd() -> Any:
    spec = importlib.util.spec_from_file_location("bfcl_single_mdd", STUDY / "mdd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_grid_runs_the_declared_recipe_unit_by_unit(capsys: pytest.CaptureFixture[str]) -> None:
    from envace.cli import lightning_cli

    cfg = load_config(str(STUDY / "grid.yaml"))
    assert (cfg.arms, cfg.seeds, cfg.evaluation.splits) == (["real_env", "sft_only"], [0, 1, 2], ["test"])
    before = os.getcwd()
    os.chdir(ROOT)
    printed = {}
    try:
        for unit in (u for u in units(cfg) if u.kind != "eval" and u.seed in (None, 0)):
            capsys.readouterr()
            with pytest.raises(SystemExit) as exit_:
                lightning_cli(["fit", *fit_args(cfg, unit), "--print_config"])
            assert exit_.value.code in (0, None), unit.key
            printed[unit.key] = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]
    finally:
        os.chdir(before)
    warm, rl, sft = printed["warm_start"], printed["run-real_env-s0"], printed["run-sft_only-s0"]
    assert warm["warm_start_steps"] == 64 and rl["warm_start_steps"] == 0 and sft["warm_start_only"]
    assert rl["optim"]["lr"] * rl["rl_lr_scale"] == pytest.approx(5e-5) and rl["optim"]["max_grad_norm"] == 1.0
    assert rl["responder"]["class_path"].endswith("RealEnvironment") and rl["limits"]["max_steps_per_turn"] == 1


def test_the_evaluation_config_is_the_held_out_split() -> None:
    from envace.evaluation.run import parse

    kw = parse(["--config", str(STUDY / "eval.yaml")])
    assert kw["benchmark"] == "bfcl-single" and kw["tasks"].split == "test" and kw["sampling"].temperature == 0.0
    assert kw["limits"].max_steps_per_turn == 1


def test_the_grid_evaluates_every_held_out_item_as_the_evaluation_config_does() -> None:
    """The eval units score what ``envace evaluate --config eval.yaml`` scores: the same items (every one of
    the test split's six categories), greedy, with the same limits and sampling precision."""
    from envace.evaluation.run import parse

    spec, kw = load_config(str(STUDY / "grid.yaml")).evaluation, parse(["--config", str(STUDY / "eval.yaml")])
    assert (spec.benchmark, spec.splits, spec.categories) == (
        kw["benchmark"],
        [kw["tasks"].split],
        kw["tasks"].categories,
    )
    assert spec.max_prompt_tokens is None and spec.tasks_per_split is None and spec.temperature == 0.0
    assert spec.strata() == [f"test:{c}" for c in kw["tasks"].categories]  # the report's columns
    model = yaml.safe_load((ROOT / "configs/bfcl_single.yaml").read_text())["model"]["init_args"]
    limits = {**model["limits"], **spec.limits}
    assert {k: getattr(kw["limits"], k) for k in limits} == limits
    assert model["sampling"]["dtype"] == kw["sampling"].dtype == "auto"


def test_the_rules_quote_the_mdd_table() -> None:
    mdd = _mdd()
    assert mdd.table(1173) in (STUDY / "rules.md").read_text()
    assert mdd.mdd_paired(1173, 3, 0.2) < mdd.mdd_unpaired(1173, 3, 0.5)
