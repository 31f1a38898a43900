"""The experiment report: bootstrap and power arithmetic, strict result files, verdicts on a grid whose
truth the test sets, byte-identical re-rendering, figures."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from envace.experiment.figures import curve_tags, mean_curve
from envace.experiment.hypotheses import families, format_interval
from envace.experiment.report import load_results, render_report, write_report
from envace.experiment.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    SUPPORTED,
    cluster_bootstrap,
    minimum_detectable_difference,
    paired_difference,
    verdict,
)

ARMS = ("envace", "real_env", "sft_only")
SEEDS = (0, 1)
SPLITS = ("val", "test")
SETTINGS = ("none", "parallel@2")
N_TASKS = 10
N_BOOT = 500
RATES = {"warm_start": 0.3, "envace": 0.8, "real_env": 0.2, "sft_only": 0.5, "simulator": 0.4}
BFCL_HYPOTHESES = yaml.safe_load((Path(__file__).parents[2] / "studies/bfcl_arms/hypotheses.yaml").read_text())
FIDELITY = {"warm_start": 0.6, "envace": 0.65, "real_env": 0.4, "sft_only": 0.55, "simulator": 0.5}


def _succeeds(rate: float, offset: int, seed: int, i: int) -> bool:
    # task i succeeds iff (i + offset + seed) mod 10 < round(10·rate): the seeds of one task can disagree
    return (i + offset + seed) % N_TASKS < round(N_TASKS * rate)


def _write(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj), encoding="utf-8")


def _eval(
    arm: str,
    seed: int | None,
    rates: dict[str, float],
    rehearsal: dict[str, float],
    offset: int,
    rehearses: bool = True,
) -> dict:
    s = seed or 0
    items, fidelity = [], []
    plain = rates.get(f"{arm}-s{seed}", rates[arm])  # a seed's own rate without rehearsal, if the test sets one
    for split in SPLITS:
        for i in range(N_TASKS):
            for setting in SETTINGS if rehearses else ("none",):
                rate = plain if setting == "none" else rehearsal.get(arm, plain)
                ok = _succeeds(rate, offset, s, i)
                n, mode = (0, "none") if setting == "none" else (2, "parallel")
                items.append(
                    {
                        "split": split,
                        "task_id": f"t{i:02d}",
                        "setting": setting,
                        "n": n,
                        "mode": mode,
                        "success": ok,
                        "score": float(ok),
                        "turn_score": 1.0 if ok else 0.25,
                    }
                )
            value = None if i == N_TASKS - 1 else FIDELITY[arm] + 0.01 * i + 0.01 * s  # the last task has no pairs
            fidelity.append(
                {
                    "split": split,
                    "task_id": f"t{i:02d}",
                    "pairs": 0 if value is None else 3,
                    "value_f1": value,
                    "key_f1": value,
                    "json_valid": 1.0,
                    "error_agreement": 1.0,
                }
            )
    policy = "warm_start" if arm == "warm_start" else f"{arm}-s{seed}"
    return {
        "unit": f"eval-{policy}",
        "kind": "eval",
        "policy": policy,
        "arm": arm,
        "seed": seed,
        "seconds": 12.5,
        "items": items,
        "fidelity": fidelity,
    }


def _run(arm: str, seed: int, env_calls: int) -> dict:
    curves = {
        "val/committed/official_success/bfcl": [[0, 0.3], [10, RATES[arm]]],
        "val/imagined/fidelity_gold/value_f1": [[0, 0.6], [10, FIDELITY[arm] + 0.01 * seed]],
        "val/committed/format_ok": [[0, 1.0]],
        "val/imagined/fidelity_gold/value_f1/tool/ls": [[0, 0.5]],  # per tool: not a panel
        "val/committed/official_success/all": [[0, 0.3]],
    }
    cost = {
        "act_tokens": 1000 + seed,
        "rehearse_tokens": 400 if arm == "envace" else 0,
        "env_calls": env_calls,
        "generated_tokens": 1400,
    }
    return {
        "unit": f"run-{arm}-s{seed}",
        "kind": "run",
        "arm": arm,
        "seed": seed,
        "seconds": 100.0 + seed,
        "steps": 10,
        "cost": cost,
        "curves": curves,
    }


def make_grid(
    folder: Path,
    arms: tuple[str, ...] = ARMS,
    rates: dict[str, float] | None = None,
    offsets: dict[str, int] | None = None,
    rehearsal: dict[str, float] | None = None,
    env_calls: dict[str, int] | None = None,
    seeds: tuple[int, ...] = SEEDS,
    rehearsal_seeds: tuple[int, ...] | None = None,
    hypotheses: list[Any] | None = None,
) -> Path:
    """Write experiment.json and units/*.json of a grid whose truth is set by the arguments.

    Args:
        folder: the experiment folder.
        arms: the grid's arms.
        rates: success rate per arm (and ``warm_start``) with no rehearsal; ``<arm>-s<seed>``: one seed's.
        offsets: which tasks an arm solves (shifts the solved block).
        rehearsal: success rate with ``parallel@2`` (default: the same as with none).
        env_calls: environment calls of each run of an arm during RL (default: 0 for envace, 40 for the rest).
        seeds: the grid's seeds.
        rehearsal_seeds: the seeds whose runs are evaluated with ``parallel@2`` (the others with none only).
        hypotheses: the declarations judged (default: the paper's H1–H4, ``studies/bfcl_arms/hypotheses.yaml``).
    """
    rates = {**RATES, **(rates or {})}
    offsets = offsets or {}
    units = folder / "units"
    units.mkdir(parents=True)
    _write(
        folder / "experiment.json",
        {
            "name": "synthetic",
            "arms": list(arms),
            "seeds": list(seeds),
            "reference_arm": "envace",
            "splits": list(SPLITS),
            "settings": list(SETTINGS),
            **({} if rehearsal_seeds is None else {"rehearsal_seeds": list(rehearsal_seeds)}),
            "hypotheses": BFCL_HYPOTHESES if hypotheses is None else hypotheses,
        },
    )
    _write(
        units / "warm_start.json",
        {"unit": "warm_start", "kind": "warm_start", "seconds": 50.0, "steps": 5, "fingerprint": "abc123"},
    )
    _write(units / "eval-warm_start.json", _eval("warm_start", None, rates, rehearsal or {}, 0))
    for arm in arms:
        for seed in seeds:
            calls = (env_calls or {}).get(arm, 0 if arm == "envace" else 40)
            rehearses = rehearsal_seeds is None or seed in rehearsal_seeds
            _write(units / f"run-{arm}-s{seed}.json", _run(arm, seed, calls))
            _write(
                units / f"eval-{arm}-s{seed}.json",
                _eval(arm, seed, rates, rehearsal or {}, offsets.get(arm, 0), rehearses),
            )
    return folder


def _report(folder: Path) -> str:
    return render_report(load_results(folder), n_boot=N_BOOT)


def _verdict_line(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"- **{name}**"))


# --- statistics ----------------------------------------------------------------------------------


def test_cluster_bootstrap_contains_the_mean_and_shrinks_with_more_tasks() -> None:
    rng = random.Random(0)

    def draw(n: int) -> dict[str, list[float]]:
        return {f"t{i}": [float(rng.random() < 0.4) for _ in range(2)] for i in range(n)}

    small, large = cluster_bootstrap(draw(10), n_boot=N_BOOT), cluster_bootstrap(draw(400), n_boot=N_BOOT)
    for mean, lo, hi in (small, large):
        assert lo <= mean <= hi
    assert large[2] - large[1] < (small[2] - small[1]) / 3  # √(400/10) ≈ 6.3 times narrower in theory


def test_cluster_bootstrap_resamples_seeds_within_a_task_and_is_deterministic() -> None:
    # one task, seeds [0, 1]: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    assert cluster_bootstrap({"a": [0.0, 1.0]}, n_boot=N_BOOT) == (0.5, 0.0, 1.0)
    values = {"a": [0.0, 1.0], "b": [1.0], "c": [0.5, 0.5, 0.0]}
    assert cluster_bootstrap(values, n_boot=N_BOOT, seed=3) == cluster_bootstrap(
        dict(reversed(values.items())), n_boot=N_BOOT, seed=3
    )
    with pytest.raises(ValueError):
        cluster_bootstrap({"a": []})


def test_paired_difference_pairs_by_shared_task() -> None:
    a = {"x": [0.9, 0.9], "y": [0.4, 0.4], "only_a": [1.0]}
    b = {"x": [0.8, 0.8], "y": [0.3, 0.3], "only_b": [0.0]}
    mean, lo, hi, n = paired_difference(a, b, n_boot=N_BOOT)  # every task differs by 0.1, whatever is resampled
    assert n == 2 and math.isclose(mean, 0.1) and math.isclose(lo, 0.1) and math.isclose(hi, 0.1)
    with pytest.raises(ValueError):
        paired_difference({"x": [1.0]}, {"y": [1.0]})


def test_a_family_of_copies_counts_once_in_the_bootstrap() -> None:
    # each task copied into three categories of its scenario, with the same outcome: resampling families
    # gives exactly the interval of the originals (one chunk of replicates, one seed per task); resampling
    # tasks treats the copies as independent and narrows the interval by about √3
    rng = random.Random(1)
    original = {f"val/multi_turn_base_{i}": [float(rng.random() < 0.4)] for i in range(30)}
    copies = {
        f"val/multi_turn_{category}_{i}": v
        for i, v in enumerate(original.values())
        for category in ("base", "miss_param", "miss_func")
    }
    scenario = {key: key.rsplit("_", 1)[1] for key in copies}
    alone = cluster_bootstrap(original, n_boot=200)
    assert cluster_bootstrap(copies, n_boot=200, families=scenario) == pytest.approx(alone)
    naive = cluster_bootstrap(copies, n_boot=200)
    assert naive[2] - naive[1] < 0.75 * (alone[2] - alone[1])
    b = {key: [v[0] - 0.5] for key, v in copies.items()}
    assert paired_difference(copies, b, n_boot=200, families=scenario)[:3] == pytest.approx((0.5, 0.5, 0.5))


def test_minimum_detectable_difference_by_hand() -> None:
    # z_0.975 + z_0.8 = 1.959964 + 0.841621 = 2.801585
    # p = 0.5, 100 tasks × 2 seeds: √(2·0.25/200) = 0.05 → 0.1400793
    assert math.isclose(minimum_detectable_difference(0.5, 100, 2), 0.1400793, abs_tol=1e-6)
    # p = 0.2, 20 tasks × 2 seeds: √(2·0.16/40) = 0.0894427 → 0.2505814
    assert math.isclose(minimum_detectable_difference(0.2, 20, 2), 0.2505814, abs_tol=1e-6)
    assert minimum_detectable_difference(0.0, 20, 2) == 0.0


@pytest.mark.parametrize(
    ("lo", "hi", "direction", "expected"),
    [
        (0.01, 0.2, "≥", SUPPORTED),
        (0.0, 0.2, "≥", INCONCLUSIVE),
        (-0.1, 0.1, ">", INCONCLUSIVE),
        (-0.2, -0.01, ">", CONTRADICTED),
        (-0.2, -0.01, "<", SUPPORTED),
        (0.1, 0.2, "≤", CONTRADICTED),
    ],
)
def test_verdict(lo: float, hi: float, direction: str, expected: str) -> None:
    assert verdict(lo, hi, direction) == expected


# --- the report ----------------------------------------------------------------------------------


def test_render_twice_is_identical(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    assert _report(folder) == _report(folder)
    first = write_report(folder, n_boot=N_BOOT).read_bytes()
    assert write_report(folder, n_boot=N_BOOT).read_bytes() == first


def test_the_report_command_draws_the_replicates_it_is_told(tmp_path: Path) -> None:
    from envace.experiment import main

    folder = make_grid(tmp_path / "exp")
    assert main(["report", str(folder), "--n_boot", "300"]) == 0
    assert (
        "300-replicate" in (folder / "report.md").read_text()
        and "2000-replicate" not in (folder / "report.md").read_text()
    )


def _per_task(
    folder: Path, arm: str, splits: tuple[str, ...], field: str, setting: str = "none", seeds: tuple[int, ...] = ()
) -> dict[str, list[float]]:
    """Per-task values recomputed from the unit files by hand (keys ``split/task``, seeds in order; ``seeds``:
    those seeds' evaluations only, and the warm start's)."""
    out: dict[str, list[float]] = {}
    files = sorted((folder / "units").glob(f"eval-{arm}*.json"))
    for doc in sorted((json.loads(f.read_text()) for f in files), key=lambda d: d["seed"] or 0):
        if seeds and doc["seed"] not in (None, *seeds):
            continue
        rows = doc["fidelity"] if field == "value_f1" else [r for r in doc["items"] if r["setting"] == setting]
        for r in rows:
            if r["split"] in splits and r[field] is not None:
                out.setdefault(f"{r['split']}/{r['task_id']}", []).append(float(r[field]))
    return out


def test_main_table_equals_a_recomputation(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    text = _report(folder)
    table = text.split("## Results")[1].split("###")[0]
    rows = {
        r.split(" | ")[0].strip("| "): r.strip("| ").split(" | ")[1:]
        for r in table.splitlines()
        if r.startswith("| ") and not r.startswith("| policy")
    }
    assert list(rows) == ["warm start", *ARMS]
    for label, cells in rows.items():
        arm = "warm_start" if label == "warm start" else label
        columns = [("val",), ("test",), SPLITS, SPLITS]
        fields = ["success", "success", "turn_score", "value_f1"]
        expected = [
            format_interval(cluster_bootstrap(_per_task(folder, arm, s, f), n_boot=N_BOOT))
            for s, f in zip(columns, fields, strict=True)
        ]
        assert cells == expected, label
    # envace solves 8 of 10 tasks on seed 0 and a shifted 8 on seed 1: per-task means 1 ×7, 0.5 ×2, 0 → 0.8
    assert rows["envace"][0].startswith("0.800 [")


def test_difference_to_the_warm_start_equals_a_recomputation(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    table = _report(folder).split("### Difference to the warm start")[1].split("##")[0]
    lines = [
        r.strip("| ").split(" | ") for r in table.splitlines() if r.startswith("| ") and not r.startswith("| policy")
    ]
    rows = {cells[0]: cells[1:] for cells in lines}
    assert list(rows) == list(ARMS)
    for arm, cells in rows.items():
        expected = []
        for splits in [("val",), ("test",), SPLITS]:
            a, b = _per_task(folder, arm, splits, "success"), _per_task(folder, "warm_start", splits, "success")
            expected.append(format_interval(paired_difference(a, b, n_boot=N_BOOT, families=families(set(a) & set(b)))))
        assert cells == [*expected, str(2 * N_TASKS)], arm
    # the sign is arm − warm start: envace (0.8) above the warm start (0.3), real_env (0.2) below it
    assert rows["envace"][2].startswith("0.500 [") and rows["real_env"][2].startswith("-0.100 [")


def test_mdd_comes_before_any_result_and_uses_the_warm_start_rate(tmp_path: Path) -> None:
    text = _report(make_grid(tmp_path / "exp"))
    assert text.index("## Minimum detectable difference") < text.index("## Results")
    mdd = text.split("## Minimum detectable difference")[1].split("## Results")[0]
    # pooled: n = 20 tasks (20 families: one task each), k = 2 seeds, p = 0.3 (warm start):
    # 2.801585·√(2·0.21/40) = 0.287; p = 0.5: 0.313
    assert "| pooled | 20 | 20 | 2 | 0.300 | 0.287 | 0.313 | 0.287 |" in mdd


def _as_bfcl_scenarios(folder: Path) -> Path:
    """Rename a grid's tasks t00–t09 to BFCL ids: tasks 2j and 2j + 1 become the base and miss_func
    categories of scenario j, so each split holds 5 families of 2 tasks."""
    for file in (folder / "units").glob("eval-*.json"):
        unit = json.loads(file.read_text())
        for row in unit["items"] + unit["fidelity"]:
            i = int(row["task_id"][1:])
            row["task_id"] = f"multi_turn_{('base', 'miss_func')[i % 2]}_{i // 2}"
        _write(file, unit)
    return folder


def test_tasks_of_one_scenario_are_one_family_in_the_mdd_and_the_intervals(tmp_path: Path) -> None:
    folder = _as_bfcl_scenarios(make_grid(tmp_path / "exp"))
    text = _report(folder)
    mdd = text.split("## Minimum detectable difference")[1].split("## Results")[0]
    # pooled: 20 tasks in 10 families, p = 0.3: with n = 10, 2.801585·√(2·0.21/20) = 0.406
    assert "| pooled | 20 | 10 | 2 | 0.300 | 0.287 | 0.313 | 0.406 |" in mdd
    for arm, row in zip(("warm_start", "envace"), _section(text, "Results")[:2], strict=True):
        turns = _per_task(folder, arm, SPLITS, "turn_score")
        clustered = cluster_bootstrap(turns, n_boot=N_BOOT, families=families(turns))
        assert row[3] == format_interval(clustered) != format_interval(cluster_bootstrap(turns, n_boot=N_BOOT))
    # envace-s0 passes t00–t07, the warm start t00–t02: per split it gains t03–t07, which fall in
    # scenarios 1, 2 and 3; pooled, 10 tasks in 6 families
    rows = {tuple(r[:2]): r for r in _section(text, "Against the warm start, task by task")}
    assert rows[("envace", "0")][5:] == ["10 (6)", "0 (0)"]


@pytest.mark.parametrize(
    ("rates", "offsets", "expected"),
    [
        ({"envace": 0.8, "real_env": 0.2}, {}, "supported"),
        ({"envace": 0.5, "real_env": 0.5}, {"real_env": 5}, "inconclusive at this scale"),  # other tasks, same rate
        ({"envace": 0.0, "real_env": 0.5}, {}, "contradicted"),
    ],
)
def test_h1_follows_the_truth(tmp_path: Path, rates: dict[str, float], offsets: dict[str, int], expected: str) -> None:
    text = _report(make_grid(tmp_path / "exp", rates=rates, offsets=offsets))
    assert f": **{expected}**." in _verdict_line(text, "H1")


def test_h1_is_contradicted_when_envace_called_the_environment(tmp_path: Path) -> None:
    line = _verdict_line(_report(make_grid(tmp_path / "exp", env_calls={"envace": 3})), "H1")
    assert "**contradicted**" in line and "s0: 3, s1: 3" in line


def test_arm_missing_from_the_grid_leaves_its_hypothesis_untested(tmp_path: Path) -> None:
    text = _report(make_grid(tmp_path / "exp"))
    assert "**not tested (arm simulator not in the grid)**" in _verdict_line(text, "H2")
    with_simulator = _report(make_grid(tmp_path / "exp2", arms=(*ARMS, "simulator")))
    assert "**supported**" in _verdict_line(with_simulator, "H2")  # envace 0.8 vs simulator 0.4 and sft_only 0.5


def test_h3_and_h4_on_the_synthetic_truth(tmp_path: Path) -> None:
    # fidelity: envace 0.65 vs warm 0.60 (holds), real_env 0.40 (falls); rehearsal lifts envace 0.8 → 1.0 only
    text = _report(make_grid(tmp_path / "exp", rehearsal={"envace": 1.0}))
    assert "**supported**" in _verdict_line(text, "H3")
    assert "**supported**" in _verdict_line(text, "H4") and "parallel@2" in _verdict_line(text, "H4")
    hurt = _report(make_grid(tmp_path / "exp2", rehearsal={"envace": 0.3}))
    assert "**contradicted**" in _verdict_line(hurt, "H4")


# --- private rehearsal on some seeds only (evaluation.rehearsal_seeds) ------------------------------


def _rehearsal_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """``(policy, setting) -> [success, gain]`` of the private-rehearsal table."""
    section = text.split("## Private rehearsal")[1].split("## Verdicts")[0]
    rows = [r.strip("| ").split(" | ") for r in section.splitlines() if r.startswith("| ") and "| setting |" not in r]
    return {(r[0], r[1]): r[2:] for r in rows}


def test_rehearsal_on_seed_0_only_is_paired_with_none_on_seed_0(tmp_path: Path) -> None:
    # envace without rehearsal: 0.5 on seed 0, 0 on seeds 1 and 2; with parallel@2 (seed 0 only): 0.8. On the
    # cells of seed 0 the gain is 0.8 − 0.5 = 0.3; against none over the three seeds it would be 0.8 − 0.5/3 = 0.633
    rates = {"envace": 0.5, "envace-s1": 0.0, "envace-s2": 0.0}
    folder = make_grid(tmp_path / "exp", seeds=(0, 1, 2), rehearsal_seeds=(0,), rates=rates, rehearsal={"envace": 0.8})
    text = _report(folder)
    rows = _rehearsal_rows(text)
    with_rehearsal = _per_task(folder, "envace", SPLITS, "success", "parallel@2")
    assert {len(v) for v in with_rehearsal.values()} == {1}  # seed 0's evaluation only
    seed0 = _per_task(folder, "envace", SPLITS, "success", seeds=(0,))
    gain = paired_difference(with_rehearsal, seed0, n_boot=N_BOOT)
    assert math.isclose(gain[0], 0.3) and rows[("envace", "parallel@2")][1] == format_interval(gain)
    assert rows[("envace", "parallel@2")][0].startswith("0.800 [")
    assert rows[("envace", "none")][0].startswith("0.167 [")  # the none row keeps every seed: 0.5 / 3
    assert "envace gain of parallel@2 over none = 0.300 [" in _verdict_line(text, "H4")
    assert "cover the runs of seed 0 of the evaluated seeds 0, 1, 2 (`evaluation.rehearsal_seeds`), and the warm " in (
        text
    )
    main = text.split("## Results")[1].split("###")[0]  # tables that compare arms at none keep every seed
    assert next(r for r in main.splitlines() if r.startswith("| envace |")).split(" | ")[1].startswith("0.167 [")


def test_without_rehearsal_seeds_the_rehearsal_section_is_as_before(tmp_path: Path) -> None:
    """Every seed rehearsed (the default): each setting against none over every seed, as the report always
    computed it, no sentence on seeds; naming every seed in rehearsal_seeds gives the same report."""
    folder = make_grid(tmp_path / "exp", rehearsal={"envace": 1.0, "warm_start": 0.2})
    text = _report(folder)
    rows = _rehearsal_rows(text)
    for label, arm in [("warm start", "warm_start"), *((a, a) for a in ARMS)]:
        none = _per_task(folder, arm, SPLITS, "success")
        rehearsed = _per_task(folder, arm, SPLITS, "success", "parallel@2")
        assert rows[(label, "none")] == [format_interval(cluster_bootstrap(none, n_boot=N_BOOT)), "—", "—"]
        expected = [cluster_bootstrap(rehearsed, n_boot=N_BOOT), paired_difference(rehearsed, none, n_boot=N_BOOT)]
        assert rows[(label, "parallel@2")] == [*(format_interval(x) for x in expected), "—"], label  # no flags
    assert "cover the runs" not in text
    every = make_grid(tmp_path / "every", rehearsal={"envace": 1.0, "warm_start": 0.2}, rehearsal_seeds=SEEDS)
    assert _report(every) == text


def test_the_rehearsal_table_counts_the_attempts_a_limit_ended(tmp_path: Path) -> None:
    """Per policy and setting: committed and imagined attempts ended by a limit, of those recorded."""
    folder = make_grid(tmp_path / "exp", rehearsal={"envace": 1.0, "warm_start": 0.2})
    file = folder / "units" / "eval-warm_start.json"
    doc = json.loads(file.read_text())
    for k, item in enumerate(doc["items"]):
        item["flags"] = ["truncated"] if k % 4 == 0 else []
        if item["setting"] != "none":
            item["imagined_flags"] = [["max_steps"], []]
    _write(file, doc)
    items = doc["items"]
    rows = _rehearsal_rows(_report(folder))
    for setting in ("none", "parallel@2"):
        mine = [k for k, it in enumerate(items) if it["setting"] == setting]
        ended = sum(k % 4 == 0 for k in mine)
        imagined = "" if setting == "none" else f" · imagined {len(mine)}/{2 * len(mine)}"
        assert rows[("warm start", setting)][-1] == f"committed {ended}/{len(mine)}{imagined}"
    assert rows[("envace", "none")][-1] == "—"


def test_partial_grid_renders_and_lists_missing_units(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    (folder / "units" / "eval-real_env-s1.json").unlink()
    assert "eval-real_env-s1" in _report(folder).split("## Minimum")[0]


def _break_missing(doc: dict) -> None:
    del doc["seconds"]


def _break_type(doc: dict) -> None:
    doc["seed"] = "0"


def _break_nested(doc: dict) -> None:
    doc["cost"]["env_calls"] = 1.5


@pytest.mark.parametrize(
    ("unit", "breaks", "field"),
    [
        ("run-envace-s0", _break_missing, "seconds"),
        ("run-real_env-s1", _break_type, "seed"),
        ("run-envace-s1", _break_nested, "cost.env_calls"),
    ],
)
def test_malformed_file_raises_naming_file_and_field(tmp_path: Path, unit: str, breaks: Any, field: str) -> None:
    folder = make_grid(tmp_path / "exp")
    path = folder / "units" / f"{unit}.json"
    doc = json.loads(path.read_text())
    breaks(doc)
    _write(path, doc)
    with pytest.raises(ValueError, match=rf"{unit}\.json: field '{field}'"):
        load_results(folder)


def test_malformed_eval_item_and_invalid_json(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    path = folder / "units" / "eval-envace-s0.json"
    doc = json.loads(path.read_text())
    doc["items"][3]["success"] = 1  # an integer is not a boolean
    _write(path, doc)
    with pytest.raises(ValueError, match=r"eval-envace-s0\.json: field 'items\[3\]\.success' must be a boolean"):
        load_results(folder)
    path.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"eval-envace-s0\.json: not valid JSON"):
        load_results(folder)


def test_figures_are_written_as_png_and_linked(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    text = write_report(folder, n_boot=N_BOOT).read_text()
    for name in ("success.png", "curves.png", "rehearsal.png", "fidelity.png"):
        assert (folder / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(figures/{name})" in text


def test_two_files_of_one_unit_are_an_error(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    doc = json.loads((folder / "units" / "eval-envace-s0.json").read_text())
    doc["unit"] = "eval-envace-s0-again"  # another name, the same policy
    _write(folder / "units" / "eval-envace-s0-again.json", doc)
    with pytest.raises(ValueError, match="policy .envace-s0. was already read from"):
        load_results(folder)


def test_curves_figure_shows_only_the_validation_tags_it_names(tmp_path: Path) -> None:
    results = load_results(make_grid(tmp_path / "exp"))
    assert curve_tags(results) == ["val/committed/official_success/bfcl", "val/imagined/fidelity_gold/value_f1"]
    # envace logged 0.8 at step 10 on both seeds; fidelity 0.65 and 0.66 average to 0.655
    assert mean_curve(results, "envace", "val/imagined/fidelity_gold/value_f1") == [(0, 0.6), (10, 0.655)]


def test_the_grid_table_names_the_code_each_unit_ran(tmp_path: Path) -> None:
    """Units run by two versions of the code (a tree edited while the grid ran) show in the report."""
    folder = make_grid(tmp_path / "exp")
    files = sorted((folder / "units").glob("*.json"))
    for i, file in enumerate(files[:3]):
        doc = json.loads(file.read_text())
        doc["code"] = {"commit": "a" * 40, "dirty": False} if i < 2 else {"commit": "b" * 40, "dirty": True}
        _write(file, doc)
    grid = _report(folder).split("## Minimum")[0]
    assert f"`{'a' * 12}`: 2, `{'b' * 12}+dirty`: 1, `unrecorded`: {len(files) - 3}" in grid


def test_a_folders_notes_stand_under_the_title_and_nowhere_without_them(tmp_path: Path) -> None:
    """A later grid's one line on an earlier report survives regenerating it: notes.md is an input."""
    folder = make_grid(tmp_path / "exp")
    assert "## Notes" not in _report(folder)
    (folder / "notes.md").write_text("Superseded by `v2`: the rate collapsed the format.\n", encoding="utf-8")
    text = _report(folder)
    assert text.index("## Notes") < text.index("## Minimum")
    assert "\n## Notes\n\nSuperseded by `v2`: the rate collapsed the format.\n" in text


def test_pauses_are_left_out_of_a_units_seconds_and_listed(tmp_path: Path) -> None:
    """A unit stopped with SIGSTOP for a while: pauses.json takes those seconds out of its cost."""
    folder = make_grid(tmp_path / "exp")
    runs_before = sum(r.seconds for r in load_results(folder).runs)  # 100 + seed per run
    _write(folder / "pauses.json", {"run-envace-s0": {"seconds": 40, "why": "stopped for a CI run"}})
    results = load_results(folder)
    assert sum(r.seconds for r in results.runs) == runs_before - 40
    assert next(r for r in results.runs if (r.arm, r.seed) == ("envace", 0)).seconds == 60.0
    text = _report(folder)
    assert "run-envace-s0: 40 s left out (stopped for a CI run)" in text.split("## Minimum")[0]
    envace_cost = next(
        line for line in text.split("## Cost of RL")[1].splitlines() if line.startswith("| envace | 2 |")
    )
    assert envace_cost.split(" | ")[2] == "80.5"  # (60 + 101) / 2


@pytest.mark.parametrize(
    "pauses, field",
    [
        ({"run-envace-s0": {"seconds": -1, "why": "x"}}, "run-envace-s0.seconds"),
        ({"run-envace-s0": {"seconds": True, "why": "x"}}, "run-envace-s0.seconds"),
        ({"run-envace-s0": {"seconds": 5}}, "run-envace-s0.why"),
        ({"run-envace-s0": {"seconds": 500, "why": "longer than the unit"}}, "seconds"),
    ],
)
def test_malformed_pauses_raise_naming_file_and_field(tmp_path: Path, pauses: dict, field: str) -> None:
    folder = make_grid(tmp_path / "exp")
    _write(folder / "pauses.json", pauses)
    with pytest.raises(ValueError, match=rf"pauses.json: field '{field}'|run-envace-s0.json: field '{field}'"):
        load_results(folder)


# --- training and the warm start task by task ---------------------------------------------------


def _section(text: str, title: str) -> list[str]:
    """The table rows of a report section, each split into cells."""
    lines = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")][1:]


def _add_train_curves(folder: Path, arm: str, seed: int, reward: list[float], kl: list[float]) -> None:
    path = folder / "units" / f"run-{arm}-s{seed}.json"
    doc = json.loads(path.read_text())
    n = len(reward)
    doc["curves"] |= {
        "train/reward/all": [[i, r] for i, r in enumerate(reward)],
        "train/success/all": [[i, r] for i, r in enumerate(reward)],
        "train/rl/kl": [[i, k] for i, k in enumerate(kl)],
        "train/official/scored": [[i, 16.0] for i in range(n)],
        "train/official/disagree/all": [[i, 0.125 if i == 0 else 0.0] for i in range(n)],  # 2 episodes at step 0
        "train/official/proxy_only/all": [[i, 0.0625 if i == 0 else 0.0] for i in range(n)],
        "train/official/official_only/all": [[i, 0.0625 if i == 0 else 0.0] for i in range(n)],
    }
    _write(path, doc)


def test_the_training_section_and_figure_from_train_curves(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp", arms=("envace", "real_env"))
    # envace: seed 0 thirds (3 points each of 9) 0.1 → 0.7, seed 1 0.3 → 0.9; KL max 0.02 and 0.04
    _add_train_curves(folder, "envace", 0, [0.1] * 3 + [0.5] * 3 + [0.7] * 3, [0.0] * 8 + [0.02])
    _add_train_curves(folder, "envace", 1, [0.3] * 3 + [0.5] * 3 + [0.9] * 3, [0.04] + [0.0] * 8)
    text = write_report(folder, n_boot=N_BOOT).read_text()
    rows = {row[0]: row for row in _section(text, "Training")}
    assert rows["envace"][1:5] == ["2", "0.200 → 0.800", "0.200 → 0.800", "0.0300"]
    # 2 runs × 9 steps × 16 scored = 288 episodes, 2 disagreeing per run: 4 / 288, one each way per run
    assert rows["envace"][-1] == f"{4 / 288:.3f} (2 / 2 of 288)"
    assert rows["real_env"][2:] == ["—"] * 9  # its files have no train/* curves: dashes, no crash
    assert (folder / "figures" / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(figures/training.png)" in text


def test_without_train_curves_the_training_table_is_dashes_and_no_figure(tmp_path: Path) -> None:
    folder = make_grid(tmp_path / "exp")
    text = write_report(folder, n_boot=N_BOOT).read_text()
    rows = _section(text, "Training")
    assert [row[0] for row in rows] == list(ARMS)
    assert all(row[1] == "2" and row[2:] == ["—"] * 9 for row in rows)
    assert not (folder / "figures" / "training.png").exists()
    assert "training.png" not in text


def test_against_the_warm_start_counts_tasks_gained_and_lost(tmp_path: Path) -> None:
    # warm start: t00–t02 pass in each split. envace (0.8): seed 0 passes t00–t07, seed 1 t00–t06 and t09:
    # 5 gained per split, none lost. real_env (0.2, shifted by 5): seed 0 passes t05, t06, seed 1 t04, t05:
    # 2 gained and 3 lost per split. Pooled over the two splits: twice that.
    folder = make_grid(tmp_path / "exp", arms=("envace", "real_env"), offsets={"real_env": 5})
    rows = _section(_report(folder), "Against the warm start, task by task")
    assert rows == [
        ["envace", "0", "20", "6", "16", "10 (10)", "0 (0)"],
        ["envace", "1", "20", "6", "16", "10 (10)", "0 (0)"],
        ["real_env", "0", "20", "6", "4", "4 (4)", "6 (6)"],
        ["real_env", "1", "20", "6", "4", "4 (4)", "6 (6)"],
    ]
