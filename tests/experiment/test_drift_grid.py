"""The drift axis of `envace experiment`: the CPU grid's units are unchanged, a grid that evaluates
another's policies under drift trains nothing, checks the weights it reads, and reports from its files
(and its source's) only."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from envace.experiment import load_config
from envace.experiment.grid import Unit, units

ROOT = Path(__file__).resolve().parents[2]


def _old_units(arms: list[str], seeds: list[int]) -> list[Unit]:
    """The grid's units as they were before the drift axis, written out."""
    out = [Unit("warm_start", "warm_start", "warm_start"), Unit("eval-warm_start", "eval", "warm_start", None,
                                                                 ("warm_start",))]  # fmt: skip
    for seed in seeds:
        for arm in arms:
            out += [Unit(f"run-{arm}-s{seed}", "run", arm, seed, ("warm_start",)),
                    Unit(f"eval-{arm}-s{seed}", "eval", arm, seed, (f"run-{arm}-s{seed}",))]  # fmt: skip
    return out


def test_the_cpu_grid_is_exactly_unchanged() -> None:
    cfg = load_config(str(ROOT / "studies/bfcl_arms/bfcl_cpu.yaml"))
    grid = units(cfg)
    assert grid == _old_units(["envace", "real_env", "simulator", "sft_only"], [0, 1, 2])
    assert [u.policy for u in grid if u.kind == "eval"] == ["warm_start"] + [
        f"{a}-s{s}" for s in (0, 1, 2) for a in ("envace", "real_env", "simulator", "sft_only")
    ]
    assert cfg.evaluation.drift == [] and cfg.evaluation.reimagine == [0] and cfg.policies_from is None
    meta = cfg.metadata()
    assert meta["settings"] == ["none", "parallel@2", "sequential@2"] and "drift" not in meta


def test_the_drift_grid_evaluates_the_cpu_grids_policies_and_trains_nothing() -> None:
    cfg = load_config(str(ROOT / "studies/bfcl_arms/bfcl_cpu_drift.yaml"))
    grid = units(cfg)
    policies = ["warm_start", "envace-s0", "real_env-s0", "simulator-s0", "sft_only-s0"]
    assert len(grid) == 12 * 5 and {u.kind for u in grid} == {"eval"} and all(u.needs == () for u in grid)
    assert [u.policy for u in grid[:5]] == policies and {u.drift for u in grid[:5]} == {"none"}
    assert len({u.key for u in grid}) == len(grid) and grid[5].key == "eval-warm_start-rename_keys-documented"
    meta = cfg.metadata()
    assert meta["settings"] == ["none", "parallel@2", "parallel@2+reimagine1"]
    assert meta["drift"][:3] == ["none", "rename_keys/documented", "rename_keys/silent"] and len(meta["drift"]) == 12


NOT_GRIDS = ("hypotheses.yaml", "rules.yaml", "eval.yaml")  # a study's declarations and its evaluate config


@pytest.mark.parametrize(
    "config", [p for p in sorted(ROOT.glob("studies/*/*.yaml")) if p.name not in NOT_GRIDS], ids=lambda p: p.stem
)
def test_every_experiment_config_loads(config: Path) -> None:
    text = config.read_text()
    assert text.startswith("#") and "envace experiment --config" in text.split("\nname:")[0]
    assert units(load_config(str(config)))


@pytest.mark.parametrize(
    ("evaluation", "extra", "why"),
    [
        ({"drift": [{"kinds": ["rename_key"]}]}, {}, "unknown drift kind 'rename_key'"),
        ({"drift": ["none", "none"]}, {}, "names a drift twice"),
        ({"drift": [{"kinds": ["units"], "loud": 1}]}, {}, "expected 'none' or"),
        ({"drift": [{"kinds": ["units"], "mode": "loud"}]}, {}, "unknown drift mode"),
        ({"reimagine": [-1]}, {}, "reimagine must list distinct integers"),
        ({}, {"arms": ["envace", "warm_start_only"]}, "not all of"),
        ({}, {"base": "configs/smoke.yaml"}, "was trained from configs/bfcl.yaml"),
    ],
)
def test_a_bad_drift_grid_is_a_one_line_error(tmp_path: Path, evaluation: dict, extra: dict, why: str) -> None:
    raw = {"name": "bad", "base": "configs/bfcl.yaml", "arms": ["envace"], "evaluation": evaluation,
           "policies_from": "studies/bfcl_arms/bfcl_cpu.yaml", **extra}  # fmt: skip
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=why) as info:
        load_config(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


# --------------------------------------------------------------------------- end to end


def _json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _unit(key: str, arm: str, seed: int | None, items: list[dict], fidelity: list[dict], drift: str | None) -> dict:
    policy = "warm_start" if arm == "warm_start" else f"{arm}-s{seed}"
    out = {"unit": key, "kind": "eval", "policy": policy, "arm": arm, "seed": seed, "seconds": 1.0, "items": items,
           "fidelity": fidelity}  # fmt: skip
    return out if drift is None else {**out, "drift": drift}


def _items(split: str, tasks: int, wins: dict[str, int], imagined: dict[str, float]) -> list[dict]:
    """Task i succeeds in a setting iff i < wins[setting]; the imagination's key_f1 per setting."""
    return [{"split": split, "task_id": f"t{i}", "setting": s, "n": 0 if s == "none" else 2,
             "mode": "none" if s == "none" else "parallel", "success": i < w, "score": float(i < w),
             "turn_score": float(i < w), "imagined_value_f1": None, "imagined_key_f1": imagined.get(s)}
            for s, w in wins.items() for i in range(tasks)]  # fmt: skip


def test_the_drift_report_from_files_whose_truth_the_test_sets(tmp_path: Path) -> None:
    from envace.experiment.drift_report import write_drift_report

    settings = ["none", "parallel@2", "parallel@2+reimagine1"]
    src, folder = tmp_path / "src", tmp_path / "drift"
    _json(src / "experiment.json", {"name": "src", "arms": ["envace"], "seeds": [0, 1], "reference_arm": "envace",
                                    "splits": ["val", "test"], "settings": ["none"]})  # fmt: skip
    both = ["TicketAPI", "TwitterAPI"]
    classes = {"test/t0": ["GorillaFileSystem"], "test/t1": ["GorillaFileSystem"], "test/t2": both, "test/t3": both}
    for arm, seed, test_wins in (("warm_start", None, 1), ("envace", 0, 3), ("envace", 1, 3)):
        items = _items("test", 4, {"none": test_wins}, {}) + _items("val", 2, {"none": 1}, {})
        key = "eval-warm_start" if seed is None else f"eval-envace-s{seed}"
        _json(src / "units" / f"{key}.json", _unit(key, arm, seed, items, [], None))
    _json(folder / "experiment.json", {
        "name": "drift", "arms": ["envace"], "seeds": [0, 1], "reference_arm": "envace", "splits": ["val"],
        "settings": settings, "drift": ["none", "units/silent"], "task_classes": classes,
        "policies_from": {"name": "src", "config": "src.yaml", "results": "../src"},
        "train_classes": ["MathAPI", "MessageAPI", "TradingBot", "TwitterAPI", "VehicleControlAPI"],
    })  # fmt: skip
    truth = {"none": ({"none": 6, "parallel@2": 6, "parallel@2+reimagine1": 6}, {"parallel@2": 0.5,
                                                                                  "parallel@2+reimagine1": 0.5}),
             "units/silent": ({"none": 3, "parallel@2": 3, "parallel@2+reimagine1": 8},
                              {"parallel@2": 0.2, "parallel@2+reimagine1": 0.7})}  # fmt: skip
    for arm, seed in (("warm_start", None), ("envace", 0), ("envace", 1)):
        for drift, (wins, imagined) in truth.items():
            policy = "warm_start" if seed is None else f"envace-s{seed}"
            key = f"eval-{policy}-{drift.replace('/', '-')}"
            fidelity = [{"split": "val", "task_id": f"t{i}", "pairs": 1, "value_f1": 0.5, "key_f1": 0.25,
                         "json_valid": 1.0, "error_agreement": 1.0} for i in range(10)]  # fmt: skip
            _json(folder / "units" / f"{key}.json", _unit(key, arm, seed, _items("val", 10, wins, imagined),
                                                          fidelity, drift))  # fmt: skip
    report = write_drift_report(folder).read_text()
    assert report == write_drift_report(folder).read_text()  # the same files, the same bytes
    assert _mean(_cell(report, "| envace | none | —", "success none")) == 0.6
    assert _mean(_cell(report, "| envace | units | silent", "success none")) == 0.3
    assert _mean(_cell(report, "| envace | units | silent", "Δ none vs no drift")) == -0.3
    assert _mean(_cell(report, "| envace | units | silent", "success parallel@2+reimagine1")) == 0.8
    fid = "Rehearsal fidelity"
    # rows written before gold layouts were recorded are the turn layout's, and the table says so
    gold = "gold value_f1 (N = 0, turn layout)"
    assert _cell(report, "| warm start | units | silent", gold, fid) == "0.500 [0.500, 0.500]"
    assert _mean(_cell(report, "| envace | units | silent", "parallel@2 imagined key_f1", fid)) == 0.2
    assert _mean(_cell(report, "| all | all drifts", "success gain")) == 0.5
    assert _mean(_cell(report, "| all | all drifts", "imagined key_f1 gain")) == 0.5
    assert _mean(_cell(report, "| all | none", "success gain")) == 0.0
    assert "over 10 tasks (20 paired (policy, drift, task) cells), it helps: keep it." in report  # 2 policies
    assert (
        _cell(report, "| GorillaFileSystem", "tasks") == "2"
        and _cell(report, "| GorillaFileSystem", "held out") == "yes"
    )
    assert _mean(_cell(report, "| GorillaFileSystem", "envace")) == 1.0  # t0, t1 < 3
    assert (
        _mean(_cell(report, "| TicketAPI", "envace")) == 0.5
        and _mean(_cell(report, "| TicketAPI", "warm start")) == 0.0
    )
    assert _cell(report, "| TwitterAPI", "held out") == "no"
    assert _mean(_cell(report, "| test: all", "envace")) == 0.75
    assert _mean(_cell(report, "| val: training classes", "envace")) == 0.5
    assert "| units missing | none |" in report
    # mean success without drift: (6 + 6 + 6) / 30 = 0.6; n = 10 val tasks, k = 2 seeds
    assert "| 0.434 at p = 0.600 (mean success without drift), 0.443 at p = 0.500; n = 10 tasks, k = 2" in report
    # val t0, t1 in both grids: t0 wins in both, t1 only here (the source's val wins 1), for each of 3 evaluations
    assert "| no drift, setting none: verdicts equal to the trained grid's | 3 of 6 items |" in report


def test_the_drift_report_counts_the_attempts_a_limit_ended(tmp_path: Path) -> None:
    """The budget fix's before/after (studies/recipe_search/bfcl_cpu_budget.yaml) is a drift-less grid of
    another experiment's policies: its report must say how many committed and imagined attempts a limit
    ended, per setting, from the items' flags (files without flags: —)."""
    from envace.experiment.drift_report import write_drift_report

    folder = tmp_path / "budget"
    meta = {"name": "budget", "arms": ["envace"], "seeds": [0], "reference_arm": "envace", "splits": ["val"],
            "settings": ["none", "parallel@2"], "drift": ["none"]}  # fmt: skip
    _json(folder / "experiment.json", meta)
    items = _items("val", 4, {"none": 2, "parallel@2": 2}, {})
    for i, it in enumerate(items):
        it["flags"] = ["max_steps"] if i < 3 else []  # none: t0, t1, t2 ended by a limit; parallel@2: none
        if it["setting"] == "parallel@2":
            it["imagined_flags"] = [["max_episode_tokens"] if it["task_id"] == "t3" else [], []]
    _json(folder / "units" / "eval-warm_start.json", _unit("eval-warm_start", "warm_start", None, items, [], None))
    _json(
        folder / "units" / "eval-envace-s0.json",
        _unit("eval-envace-s0", "envace", 0, _items("val", 4, {"none": 1, "parallel@2": 1}, {}), [], None),
    )
    report = write_drift_report(folder).read_text()
    assert _cell(report, "| warm start | none", "ended by a limit none") == "committed 3/4"
    assert _cell(report, "| warm start | none", "ended by a limit parallel@2") == "committed 0/4 · imagined 1/8"
    assert _cell(report, "| envace | none", "ended by a limit parallel@2") == "—"


def test_a_gain_of_one_task_under_every_drift_is_one_task_not_many(tmp_path: Path) -> None:
    """The mitigation flips one task of ten, for both policies under each of ten drifts: twenty gains of 1
    among 200 cells. Cells bootstrapped as independent samples would call that a clear gain; clustered by
    task, the ten-task interval reaches 0 (t0 is left out of a replicate ~35 % of the time)."""
    from envace.experiment.drift_report import write_drift_report

    settings = ["none", "parallel@2", "parallel@2+reimagine1"]
    drifts = ["none", *(f"units/silent/seed{i}" for i in range(1, 11))]
    _json(tmp_path / "experiment.json", {"name": "drift", "arms": ["envace"], "seeds": [0],
                                         "reference_arm": "envace", "splits": ["val"], "settings": settings,
                                         "drift": drifts})  # fmt: skip
    wins = {"none": 0, "parallel@2": 0, "parallel@2+reimagine1": 1}
    for arm, seed in (("warm_start", None), ("envace", 0)):
        for drift in drifts:
            policy = "warm_start" if seed is None else f"envace-s{seed}"
            key = f"eval-{policy}-{drift.replace('/', '-')}"
            _json(tmp_path / "units" / f"{key}.json", _unit(key, arm, seed, _items("val", 10, wins, {}), [], drift))
    report = write_drift_report(tmp_path).read_text()
    gain = _cell(report, "| all | all drifts", "success gain")
    assert _mean(gain) == 0.1 and gain.startswith("0.100 [0.000, ")
    assert "over 10 tasks (200 paired (policy, drift, task) cells), no effect detected at this scale" in report


def _write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def _experiment(config: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envace.cli", "experiment", "--config", str(config), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _cell(report: str, row_start: str, column: str, section: str = "") -> str:
    """The cell of ``column`` in the first table row that starts with ``row_start`` (after ``## section``)."""
    lines = report.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"## {section}"))
    for i, line in enumerate(lines):
        if i > first and line.startswith(row_start):
            header = next(h for h in reversed(lines[:i]) if h.startswith("| policy") or h.startswith("| API class"))
            names = [c.strip() for c in header.strip("|").split("|")]
            return [c.strip() for c in line.strip("|").split("|")][names.index(column)]
    raise AssertionError(f"no row {row_start!r}")


def _mean(cell: str) -> float:
    return float(re.match(r"(-?[0-9.]+) \[", cell).group(1))  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_tiny_drift_grid_end_to_end(tmp_path: Path) -> None:
    base = str(ROOT / "configs/smoke.yaml")
    source = _write(tmp_path / "source.yaml", {
        "name": "tiny_source", "base": base, "arms": ["envace"], "seeds": [0], "warm_start_steps": 2,
        "rl_steps": 2, "val_every": 0, "results": str(tmp_path / "source"), "work": str(tmp_path / "work"),
        "evaluation": {"splits": ["val", "test"], "tasks_per_split": 2, "n_values": [0], "max_prompt_tokens": 1200},
    })  # fmt: skip
    done = _experiment(source, "--no-report")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    drift = _write(tmp_path / "drift.yaml", {
        "name": "tiny_drift", "base": base, "arms": ["envace"], "seeds": [0], "policies_from": str(source),
        "results": str(tmp_path / "drift"), "work": str(tmp_path / "drift_work"),
        "evaluation": {"splits": ["val"], "tasks_per_split": 2, "n_values": [0, 2], "modes": ["parallel"],
                       "reimagine": [0, 1], "max_prompt_tokens": 1200,
                       "drift": ["none", {"kinds": ["nest_result"], "mode": "silent"},
                                 {"kinds": ["rename_tool"], "mode": "documented"}]},
    })  # fmt: skip
    began = time.perf_counter()
    out = _experiment(drift)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    seconds = time.perf_counter() - began
    folder = tmp_path / "drift"
    files = sorted(p.name for p in (folder / "units").glob("*.json"))
    assert len(files) == 6  # and it trains nothing: its work folder holds its evaluations' parts, no checkpoint
    kept = [p for p in (tmp_path / "drift_work").rglob("*") if p.is_file()]
    assert kept and all(p.name == "attempts.json" or "eval-parts" in p.parts for p in kept), kept
    unit = json.loads((folder / "units" / "eval-envace-s0-nest_result-silent.json").read_text())
    assert unit["drift"] == "nest_result/silent" and unit["drift_spec"]["kinds"] == ["nest_result"]
    assert unit["checkpoint"] == str(tmp_path / "work" / "run-envace-s0" / "fit" / "checkpoints" / "last.ckpt")
    assert {i["setting"] for i in unit["items"]} == {"none", "parallel@2", "parallel@2+reimagine1"}
    assert all(i["imagined_pairs"] == 0 for i in unit["items"] if i["setting"] == "none")
    assert len(unit["fidelity"]) == 2
    print(f"\n[tiny drift grid] 6 units in {seconds:.0f} s; unit seconds "
          f"{[json.loads((folder / 'units' / f).read_text())['seconds'] for f in files]}")  # fmt: skip

    from envace.experiment.drift_report import load_grid, load_source_results, render_drift_report
    from envace.experiment.results import load_results

    report = (folder / "report.md").read_text()
    grid = load_grid(folder)
    assert report == render_drift_report(load_results(folder), grid, load_source_results(folder, grid))
    # numbers recomputed from the result files themselves
    items = [i for i in unit["items"] if i["setting"] == "none"]
    success = sum(i["success"] for i in items) / len(items)
    assert _mean(_cell(report, "| envace | nest_result | silent", "success none")) == pytest.approx(success, abs=5e-4)
    test = [i for i in json.loads((tmp_path / "source" / "units" / "eval-envace-s0.json").read_text())["items"]
            if i["split"] == "test" and i["setting"] == "none"]  # fmt: skip
    cell = _cell(report, "| test: all", "envace")
    assert _mean(cell) == pytest.approx(sum(i["success"] for i in test) / len(test), abs=5e-4)
    classes = json.loads((folder / "experiment.json").read_text())["task_classes"]
    assert all(f"test/{i['task_id']}" in classes for i in test)
    assert "| GorillaFileSystem | yes |" in report or any(f"| {c} | yes |" in report for v in classes.values()
                                                         for c in v)  # fmt: skip
    assert "no drift, setting none: verdicts equal to the trained grid's | 4 of 4 items" in report  # 2 policies x 2
    assert re.search(r"- \*\*parallel@2\+reimagine1 against parallel@2\*\*, under drift, every policy: gain", report)

    # the source's checkpoint is gone: the grid stops in one line, it never trains
    ckpt = Path(unit["checkpoint"])
    moved = ckpt.with_suffix(".moved")
    shutil.move(ckpt, moved)
    (folder / "units" / "eval-envace-s0-none.json").unlink()
    failed = _experiment(drift, "--unit", "eval-envace-s0-none", timeout=600)
    assert failed.returncode != 0 and "is missing" in failed.stderr and "this grid evaluates" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    shutil.move(moved, ckpt)
