"""Hypotheses as data (:mod:`envace.experiment.judge`): each rule on a grid whose truth the test sets
(tests/experiment/test_report.py's synthetic grid: 10 tasks per split, task ``tNN`` of an arm of rate r
succeeds iff (NN + seed) mod 10 < 10·r), and the one-line errors of a wrong declaration."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from envace.experiment.hypotheses import Boot
from envace.experiment.judge import judge, load, parse
from envace.experiment.report import load_results
from envace.experiment.stats import CONTRADICTED, INCONCLUSIVE, SUPPORTED

_spec = importlib.util.spec_from_file_location("synthetic_grid", Path(__file__).with_name("test_report.py"))
assert _spec and _spec.loader
_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grid)
make_grid = _grid.make_grid  # the synthetic grid of test_report.py, one copy

BOOT = Boot(n_boot=500)


def _verdict(tmp_path: Path, declaration: dict[str, Any], **grid: Any) -> tuple[str, str]:
    folder = make_grid(tmp_path / "exp", hypotheses=[{"name": "H", "statement": "s", **declaration}], **grid)
    (v,) = judge(load_results(folder), BOOT)
    return v.verdict, v.evidence


@pytest.mark.parametrize(
    ("real_env", "expected"),
    [
        (1.0, SUPPORTED),  # with envace at 1.0 too: every task equal, the interval [0, 0] lies above −0.05
        (0.6, SUPPORTED),  # +0.1 [−0.025, 0.225]: above −0.05, though not above 0
        (0.4, INCONCLUSIVE),  # −0.1 [−0.225, 0.025]: straddles −0.05
        (0.2, CONTRADICTED),  # −0.3 [−0.513, −0.087]: below −0.05
    ],
)
def test_non_inferiority_with_a_margin(tmp_path: Path, real_env: float, expected: str) -> None:
    declaration = {"compare": [{"a": "real_env", "b": "envace"}], "rule": "non_inferiority", "margin": 0.05}
    rates = {"real_env": real_env, "envace": 1.0 if real_env == 1.0 else 0.5}
    assert _verdict(tmp_path, declaration, rates=rates)[0] == expected


def test_superiority_is_not_non_inferiority(tmp_path: Path) -> None:
    """+0.1 [−0.025, 0.225]: non-inferior at a 0.05 margin (above), not superior (the interval holds 0)."""
    rates = {"real_env": 0.6, "envace": 0.5}
    assert _verdict(tmp_path, {"compare": [{"a": "real_env", "b": "envace"}]}, rates=rates)[0] == INCONCLUSIVE


def test_a_precondition_short_of_its_threshold_leaves_the_hypothesis_undecided(tmp_path: Path) -> None:
    declaration = {
        "compare": [{"a": "envace", "b": "real_env"}],
        "precondition": {"a": "real_env", "b": "warm_start", "at_least": 0.10},
    }
    # real_env as good as the warm start (0.3): the precondition's mean, 0, is short of 0.10
    verdict, _ = _verdict(tmp_path, declaration, rates={"real_env": 0.3})
    assert verdict.startswith("not decidable (pooled success real_env − warm start = 0.000 [")
    assert verdict.endswith("over 20 tasks, short of the 0.1 it needs)")
    assert not _verdict(tmp_path / "b", declaration, rates={"real_env": 0.5})[0].startswith("not decidable")  # +0.2


def test_a_predicted_null_control_must_stay_null(tmp_path: Path) -> None:
    null = {"a": "sft_only", "b": "warm_start", "predict": "null", "label": "control"}
    declaration = {"compare": [{"a": "envace", "b": "real_env"}], "controls": [null]}
    # sft_only equal to the warm start: the control holds, envace 0.8 > real_env 0.2 decides
    assert _verdict(tmp_path, declaration, rates={"sft_only": 0.3})[0] == SUPPORTED
    # sft_only 0.5 > 0.3: the control moved, so the comparison cannot be credited: inconclusive, never contradicted
    verdict, evidence = _verdict(tmp_path / "b", declaration, rates={"sft_only": 0.5})
    assert verdict == INCONCLUSIVE and "control = 0.200 [" in evidence


def test_where_keeps_a_stratum_of_tasks(tmp_path: Path) -> None:
    """``where`` filters the task keys: a split, and a pattern of task ids (a stratum)."""
    compare = {"a": "envace", "b": "real_env"}
    everything = _verdict(tmp_path, {"compare": [compare]})[1]
    val = _verdict(tmp_path / "b", {"compare": [{**compare, "where": {"split": "val"}}]})[1]
    stratum = _verdict(tmp_path / "c", {"compare": [{**compare, "where": {"split": ["val"], "task": "t0[0-4]"}}]})[1]
    assert "over 20 tasks" in everything and "over 10 tasks" in val and "over 5 tasks" in stratum


def test_the_default_rule_text_is_written_from_the_fields() -> None:
    (h,) = parse(
        [{"name": "N", "statement": "s", "compare": [{"a": "x", "b": "y"}], "rule": "non_inferiority", "margin": 0.05}]
    )
    from envace.experiment.judge import explain

    assert explain(h) == (
        "supported if the interval of pooled success x − y has lo > -0.05; contradicted (checked first) if any "
        "has hi < -0.05; otherwise inconclusive"
    )


@pytest.mark.parametrize(
    ("declaration", "why"),
    [
        ({"statement": "s", "compare": []}, "needs name, statement and compare"),
        ({"name": "H", "statement": "s", "compare": [{"a": "x", "b": "y"}], "rule": "better"}, "a rule among"),
        ({"name": "H", "statement": "s", "compare": [{"a": "x", "b": "y", "metric": "f1"}]}, "'f1' is not one of"),
        ({"name": "H", "statement": "s", "compare": [{"a": "x"}]}, "success needs b"),
        ({"name": "H", "statement": "s", "compare": [{"a": "x", "b": "y"}], "typo": 1}, "unknown field 'typo'"),
        (
            {"name": "H", "statement": "s", "compare": [{"a": "x", "b": "y"}], "controls": [{"a": "x", "b": "y"}]},
            "predict: expected one of",
        ),
        ({"name": "H", "statement": "s", "compare": [{"a": "x", "b": "y", "where": {"seed": 0}}]}, "only split"),
        (
            {
                "name": "H",
                "statement": "s",
                "compare": [{"a": "x", "b": "y", "metric": "decision_f1"}],
                "every_seed": 1,
            },
            "every_seed judges success differences only",
        ),
    ],
)
def test_a_wrong_declaration_is_a_one_line_error(declaration: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match="hypotheses") as err:
        load([declaration])
    assert why in str(err.value) and "\n" not in str(err.value)


def test_the_paper_hypotheses_load_from_their_study() -> None:
    declared = load(str(Path(__file__).parents[2] / "studies/bfcl_arms/hypotheses.yaml"))
    assert [h["name"] for h in declared] == ["H1", "H2", "H3", "H4"]


def test_an_experiment_config_records_its_declarations_and_rejects_wrong_ones(tmp_path: Path) -> None:
    from envace.experiment.grid import load_config

    root = Path(__file__).parents[2]
    config = tmp_path / "grid.yaml"
    config.write_text(
        f"name: g\nbase: configs/smoke.yaml\narms: [envace]\nhypotheses: {root}/studies/bfcl_arms/hypotheses.yaml\n"
    )
    meta = load_config(str(config)).metadata()
    assert [h["name"] for h in meta["hypotheses"]] == ["H1", "H2", "H3", "H4"]
    config.write_text("name: g\nbase: configs/smoke.yaml\narms: [envace]\nhypotheses: [{name: H, statement: s}]\n")
    with pytest.raises(ValueError, match=r"grid.yaml: hypotheses\[0\]: a hypothesis needs name, statement and compare"):
        load_config(str(config))


def test_a_grid_without_declarations_says_so(tmp_path: Path) -> None:
    from envace.experiment.report import render_report

    text = render_report(load_results(make_grid(tmp_path / "exp", hypotheses=[])), n_boot=100)
    verdicts = text.split("## Verdicts")[1].split("##")[0]
    assert "No hypotheses declared" in verdicts and "**H1**" not in verdicts


def test_every_seed_holds_a_superiority_to_each_runs_own_difference(tmp_path: Path) -> None:
    """Runs as units: real_env's seeds gain +0.5, +0.5 and −0.1 on the warm start (0.3). The pooled
    interval lies above 0, so the plain rule supports it; with ``every_seed`` the third seed's own
    difference leaves it inconclusive. Either way the evidence names each seed's difference."""
    rates = {"real_env-s0": 0.8, "real_env-s1": 0.8, "real_env-s2": 0.2, "warm_start": 0.3}
    declaration: dict[str, Any] = {"compare": [{"a": "real_env", "b": "warm_start"}]}
    plain, evidence = _verdict(tmp_path, declaration, rates=rates, seeds=(0, 1, 2))
    assert plain == SUPPORTED
    assert "pooled success real_env − warm start by seed: s0 +0.500, s1 +0.500, s2 -0.100" in evidence
    strict, _ = _verdict(tmp_path / "b", {**declaration, "every_seed": True}, rates=rates, seeds=(0, 1, 2))
    assert strict == INCONCLUSIVE
    agreeing = {**rates, "real_env-s2": 0.6}
    agreed, _ = _verdict(tmp_path / "c", {**declaration, "every_seed": True}, rates=agreeing, seeds=(0, 1, 2))
    assert agreed == SUPPORTED
