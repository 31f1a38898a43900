"""Gold fidelity per gold layout (``evaluation.gold_layouts``): each row names the layout its oracle
wrote (``turn``: a turn's gold calls in one act step; ``call``: one an act step, as training episodes
are laid out), two layouts of a task never merge, the report and the judge compare fidelity in one
layout that every evaluation compared holds, and ``--add-fidelity`` adds a layout to a landed unit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from envace.experiment import evaluate as unit_eval
from envace.experiment.evalspec import EvalSpec
from envace.experiment.grid import WARM, ExperimentConfig, result_path, units, write_result
from envace.experiment.hypotheses import Boot
from envace.experiment.judge import judge
from envace.experiment.report import load_results, main_table, render_report
from envace.experiment.results import fidelity_values

_spec = importlib.util.spec_from_file_location("synthetic_grid", Path(__file__).with_name("test_report.py"))
assert _spec and _spec.loader
_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grid)
make_grid = _grid.make_grid  # the synthetic grid of test_report.py, one copy
BOOT = Boot(n_boot=200)
ROOT = Path(__file__).resolve().parents[2]


def test_the_evaluation_measures_the_call_layout_unless_told_and_refuses_an_unknown_one() -> None:
    assert EvalSpec().gold_layouts == ["call"] and EvalSpec(gold_layouts=["turn", "call"]).gold_layouts
    for bad in (["step"], ["call", "call"], [], "call"):
        with pytest.raises(ValueError, match="^evaluation.gold_layouts must list distinct layouts of turn, call"):
            EvalSpec(gold_layouts=bad)  # type: ignore[arg-type]


def test_gold_fidelity_rows_name_their_layout(tokenizer, tiny_model) -> None:
    """A 2-layer random model rehearses a two-call ShopWorld task's gold calls in each layout (its
    rehearsal never stops: the episode ends truncated at the first pair), and each row says which
    layout the oracle wrote."""
    from envace.data.sources.shopworld import load_shopworld
    from envace.protocol.render import HermesFormat
    from envace.rollout import RolloutLimits, SamplingConfig

    task = next(t for t in load_shopworld("test") if len(t.gold[0]) == 2)
    policy = SimpleNamespace(model=tiny_model, tokenizer=tokenizer, fmt=HermesFormat(tool_style="compact"))
    limits, greedy = RolloutLimits(max_new_tokens=8, max_rehearse_tokens=8), SamplingConfig(temperature=0.0)
    for layout in ("turn", "call"):
        (row,) = unit_eval.gold_fidelity(policy, [task], limits, greedy, "test", layout)
        assert (row["task_id"], row["layout"], row["pairs"]) == (task.id, layout, 1)


def _fake_evaluation(monkeypatch: pytest.MonkeyPatch, ran: list[str]) -> None:
    """``evaluate_unit``'s heavy parts stubbed: no items, and a gold fidelity of value 0.2 in the turn
    layout, 0.8 in the call layout, on one task per split (each run noted in ``ran``)."""
    import envace.evaluation
    import envace.evaluation.policies

    def gold_fidelity(
        policy: Any, tasks: Any, limits: Any, sampling: Any, split: str, layout: str, first: int = 0
    ) -> list[dict]:
        ran.append(f"{split} {layout}")
        value = {"turn": 0.2, "call": 0.8}[layout]
        return [{"split": split, "task_id": "t1", "layout": layout, "pairs": 2, "value_f1": value, "key_f1": value,
                 "json_valid": 1.0, "error_agreement": 1.0, "decision_f1": value}]  # fmt: skip

    monkeypatch.setattr(envace.evaluation, "evaluate", lambda *a, **k: SimpleNamespace(items=[]))
    monkeypatch.setattr(
        envace.evaluation.policies, "load_eval_policy", lambda *a, **k: SimpleNamespace(tokenizer=None, fmt=None)
    )
    monkeypatch.setattr(unit_eval, "held_out", lambda *a: [])
    monkeypatch.setattr(unit_eval, "gold_fidelity", gold_fidelity)


def _cfg(tmp_path: Path, layouts: list[str]) -> ExperimentConfig:
    return ExperimentConfig("x", str(ROOT / "configs/smoke.yaml"), ["envace"], seeds=[0], results=str(tmp_path / "r"),
                            work=str(tmp_path / "w"), evaluation=EvalSpec(splits=["val"], n_values=[0],
                                                                          gold_layouts=layouts))  # fmt: skip


def test_a_unit_of_two_layouts_keeps_each_in_its_own_part_and_series(tmp_path: Path, monkeypatch) -> None:
    """Each layout is its own part (``turn``'s under its old name: an evaluation begun before layouts
    resumes from it, its rows read as ``turn``'s) and its own per-task series: a task's two layouts are
    never averaged (they would give 0.5 here)."""
    ran: list[str] = []
    _fake_evaluation(monkeypatch, ran)
    cfg = _cfg(tmp_path, ["turn", "call"])
    parts = tmp_path / "parts"
    parts.mkdir()
    old = {"split": "val", "task_id": "t1", "pairs": 2, "value_f1": 0.2, "key_f1": 0.2, "json_valid": 1.0,
           "error_agreement": 1.0}  # fmt: skip
    (parts / "val-gold-fidelity.json").write_text(json.dumps([old]))  # the part an older attempt left
    unit = next(u for u in units(cfg) if u.key == "eval-warm_start")
    result = unit_eval.evaluate_unit(cfg, unit, tmp_path / "last.ckpt", parts)
    call_part, turn_part = sorted(p.name for p in parts.glob("*gold-fidelity*"))  # the call layout's in chunks
    assert ran == ["val call"] and call_part.startswith("val-gold-fidelity-call-tasks0000-0000-of0-")
    assert turn_part == "val-gold-fidelity.json"
    assert [(r["layout"], r["value_f1"]) for r in result["fidelity"]] == [("turn", 0.2), ("call", 0.8)]
    folder = make_grid(tmp_path / "exp", arms=("envace",), seeds=(0,))
    (folder / "units" / f"{unit.key}.json").write_text(json.dumps({**result, "seconds": 1.0}))
    results = load_results(folder)
    assert fidelity_values(results, WARM, ["val"], layout="call") == {"val/t1": [0.8]}
    assert fidelity_values(results, WARM, ["val"], layout="turn") == {"val/t1": [0.2]}


def _with_layouts(folder: Path, layouts: dict[str, tuple[str, ...]]) -> Path:
    """The synthetic grid's evaluation files, their fidelity rows given in each of ``layouts[unit]``
    (the call layout's values 0.3 above the turn layout's: a figure shows which it read)."""
    for unit, held in layouts.items():
        path = folder / "units" / f"{unit}.json"
        doc = json.loads(path.read_text())
        rows = [
            {**r, "layout": layout, **({"value_f1": r["value_f1"] + 0.3} if layout == "call" and r["value_f1"] else {})}
            for layout in held
            for r in doc["fidelity"]
        ]
        path.write_text(json.dumps({**doc, "fidelity": rows}))
    return folder


H_FIDELITY = [{"name": "HF", "statement": "fidelity holds", "rule": "non_inferiority", "margin": 0.5,
               "compare": [{"a": "envace", "b": "warm_start", "metric": "value_f1"}]}]  # fmt: skip
BOTH = ("turn", "call")


@pytest.mark.parametrize(
    ("warm", "arm", "expected"),
    [(BOTH, BOTH, "call"), (BOTH, ("call",), "call"), (("turn",), BOTH, "turn"), (("turn",), ("call",), None)],
)
def test_the_report_and_the_judge_compare_fidelity_in_one_layout_all_hold(tmp_path: Path, warm, arm, expected) -> None:
    units_ = {"eval-warm_start": warm, "eval-envace-s0": arm}
    folder = make_grid(tmp_path / "exp", arms=("envace",), seeds=(0,), hypotheses=H_FIDELITY)
    results = load_results(_with_layouts(folder, units_))
    report = render_report(results, n_boot=200)
    (verdict,) = judge(results, BOOT)
    if expected is None:
        line = "no gold layout common to every evaluation compared (call: envace-s0; turn: warm_start)"
        assert f"Gold-call value_f1: {line}: gold-call fidelity not compared." in report.splitlines()
        assert all(row[-1] == "—" for row in main_table(results, BOOT))
        assert verdict.verdict == f"not tested (value_f1 envace − warm start: {line}: gold-call fidelity not compared)"
        return
    assert f"gold-call value_f1 (pooled, {expected} layout) |" in report
    assert f"value_f1 envace − warm start ({expected} gold layout) = " in verdict.evidence
    assert f"Gold-call rehearsal fidelity (value_f1, pooled, {expected} gold layout)" in report
    warm_cell = main_table(results, BOOT)[0][-1]
    # the warm start's per-task values in that layout (t00..t08 at 0.60 + 0.01·i; 0.3 more in call)
    assert warm_cell.startswith("0.940" if expected == "call" else "0.640"), warm_cell


def test_a_report_of_files_written_before_layouts_reads_them_as_turn(tmp_path: Path) -> None:
    """Old files (rows without a layout) keep their figures; the report names the layout beside them."""
    results = load_results(make_grid(tmp_path / "exp", arms=("envace",), seeds=(0,)))
    assert {f.layout for e in results.evals for f in e.fidelity} == {"turn"}
    assert "gold-call value_f1 (pooled, turn layout)" in render_report(results, n_boot=200)
    assert main_table(results, BOOT)[0][-1].startswith("0.640")


def _landed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ExperimentConfig, Any, list[str]]:
    """A grid whose warm start and its evaluation (turn layout only, from before evaluations recorded
    their weights) landed; the evaluation's heavy parts stubbed as in :func:`_fake_evaluation`."""
    from envace.experiment import runner

    ran: list[str] = []
    _fake_evaluation(monkeypatch, ran)
    cfg = _cfg(tmp_path, ["turn"])
    warm, ev = units(cfg)[:2]
    last = runner.last_checkpoint(cfg, WARM)
    last.parent.mkdir(parents=True)
    torch.save({"state_dict": {"policy.lora_A": torch.arange(6.0).view(2, 3)}, "global_step": 2}, last)
    write_result(cfg, warm, {"unit": WARM, "kind": WARM, "seconds": 1.0, "steps": 2,
                             "fingerprint": runner.fingerprint(last)})  # fmt: skip
    landed = unit_eval.evaluate_unit(cfg, ev, last)
    write_result(cfg, ev, {**landed, "seconds": 5.0})
    ran.clear()
    return cfg, ev, ran


def test_add_fidelity_appends_a_layout_with_its_provenance_once(tmp_path: Path, monkeypatch) -> None:
    from envace.experiment import main

    cfg, ev, ran = _landed(tmp_path, monkeypatch)
    before = json.loads(result_path(cfg, ev).read_text())
    # the checkout moves while the layout runs: the record names the commit read before it ran
    monkeypatch.setattr("envace.experiment.add_fidelity.git_commit", lambda: {"commit": ("b" if ran else "a") * 40})
    config = tmp_path / "x.yaml"
    config.write_text(json.dumps({"name": "x", "base": cfg.base, "arms": ["envace"], "seeds": [0],
                                  "results": cfg.results, "work": cfg.work,
                                  "evaluation": {"splits": ["val"], "n_values": [0]}}))  # fmt: skip
    assert main(["--config", str(config), "--unit", ev.key, "--add-fidelity", "call"]) == 0
    after = json.loads(result_path(cfg, ev).read_text())
    assert ran == ["val call"] and after["items"] == before["items"] and after["seconds"] == before["seconds"]
    assert [(r["layout"], r["value_f1"]) for r in after["fidelity"]] == [("turn", 0.2), ("call", 0.8)]
    (added,) = after["fidelity_added"]
    assert added["layout"] == "call" and added["code"] == {"commit": "a" * 40} and added["seconds"] >= 0
    from envace.experiment.add_fidelity import add_fidelity

    with pytest.raises(ValueError, match="already holds gold fidelity in the call layout"):
        add_fidelity(cfg, ev, "call")
    with pytest.raises(ValueError, match="gold layout must be one of turn, call, got 'step'"):
        add_fidelity(cfg, ev, "step")
    assert ran == ["val call"]


def test_add_fidelity_refuses_other_weights_than_the_unit_records(tmp_path: Path, monkeypatch) -> None:
    from envace.experiment.add_fidelity import add_fidelity

    cfg, ev, ran = _landed(tmp_path, monkeypatch)
    doc = json.loads(result_path(cfg, ev).read_text())
    write_result(cfg, ev, {**doc, "fingerprint": "0" * 64})  # the evaluation was of other weights
    with pytest.raises(ValueError, match=r"holds other weights \(\w{12}\) than its result file records \(000000"):
        add_fidelity(cfg, ev, "call")
    assert ran == [] and "fidelity_added" not in json.loads(result_path(cfg, ev).read_text())
