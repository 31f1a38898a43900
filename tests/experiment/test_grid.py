"""`envace experiment` end to end on a tiny grid: units, result files, a kill in the middle, resume, and a
report whose numbers come from the result files only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from envace.experiment import load_config
from envace.experiment.grid import units
from envace.experiment.runner import fit_args

ROOT = Path(__file__).resolve().parents[2]


def tiny_grid(tmp: Path) -> Path:
    """2 arms x 2 seeds on the smoke config: 2 warm-start steps, 2 RL steps per run, 2 tasks per split."""
    config = {
        "name": "tiny", "base": str(ROOT / "configs/smoke.yaml"), "arms": ["envace", "real_env"], "seeds": [0, 1],
        "warm_start_steps": 2, "rl_steps": 2, "val_every": 2, "results": str(tmp / "results"),
        "work": str(tmp / "work"),
        "evaluation": {"splits": ["val", "test"], "tasks_per_split": 2, "n_values": [0, 2], "modes": ["parallel"],
                       "max_prompt_tokens": 1200},
    }  # fmt: skip
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def experiment(config: Path, *args: str, **kw):
    return subprocess.Popen([sys.executable, "-m", "envace.cli", "experiment", "--config", str(config), *args],
                            cwd=ROOT, start_new_session=True, **kw)  # fmt: skip


@pytest.mark.slow
def test_a_tiny_grid_runs_is_killed_resumes_and_reports_from_its_files(tmp_path: Path) -> None:
    config = tiny_grid(tmp_path)
    cfg = load_config(str(config))
    keys = [u.key for u in units(cfg)]
    runs = [f"{kind}-{arm}-s{seed}" for seed in (0, 1) for arm in ("envace", "real_env") for kind in ("run", "eval")]
    assert keys == ["warm_start", "eval-warm_start", *runs]
    done = cfg.results_dir / "units"
    proc = experiment(config, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (done / "run-envace-s0.json").exists():  # kill it in the middle of the grid
        assert proc.poll() is None and time.time() < deadline, "the grid stopped before its third unit"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {p.name for p in done.glob("*.json")}
    assert {"warm_start.json", "eval-warm_start.json", "run-envace-s0.json"} <= before and len(before) < len(keys)
    mtimes = {p.name: p.stat().st_mtime_ns for p in done.glob("*.json")}
    finished = experiment(config, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = finished.communicate(timeout=1200)
    assert finished.returncode == 0, out[-3000:]
    assert {p.name for p in done.glob("*.json")} == {f"{k}.json" for k in keys}
    assert all(done.joinpath(n).stat().st_mtime_ns == t for n, t in mtimes.items())  # done units were not rerun
    assert "done 10/10" in out

    warm = json.loads((done / "warm_start.json").read_text())
    assert warm["steps"] == 2 and len(warm["fingerprint"]) == 64
    for seed in (0, 1):
        envace = json.loads((done / f"run-envace-s{seed}.json").read_text())
        real = json.loads((done / f"run-real_env-s{seed}.json").read_text())
        assert envace["steps"] == real["steps"] == 2
        assert envace["cost"]["env_calls"] == 0  # self-rehearsal: no environment during RL
        assert any(t.startswith("val/committed/") for t in envace["curves"])
        assert len(envace["curves"]["train/reward/all"]) == 2  # one a step: why a run moved, kept
    ev = json.loads((done / "eval-envace-s0.json").read_text())
    assert {i["split"] for i in ev["items"]} == {"val", "test"}
    assert {i["setting"] for i in ev["items"]} == {"none", "parallel@2"}
    assert len({(i["split"], i["task_id"]) for i in ev["items"]}) == 4 and len(ev["fidelity"]) == 4

    from envace.experiment.report import load_results, render_report

    report = (cfg.results_dir / "report.md").read_text()
    assert report == render_report(load_results(cfg.results_dir))  # every number recomputed from the files
    # the warm start's weights are kept with the result files: a fresh machine, without the grid's work
    # folder, restores them from there (not by a fit run again: on another CPU that gives other weights)
    # and evaluates from them
    import shutil

    from envace.experiment.runner import fingerprint

    kept = cfg.results_dir / "checkpoints" / "warm_start.ckpt"
    assert fingerprint(kept) == warm["fingerprint"]
    shutil.rmtree(cfg.work_dir / "warm_start")
    (done / "eval-warm_start.json").unlink()
    again = experiment(config, "--no-report", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0 and "restored from" in out and kept.name in out, out[-3000:]
    assert "running its fit again" not in out
    assert (done / "eval-warm_start.json").exists()
    listed = subprocess.run([sys.executable, "-m", "envace.cli", "experiment", "--config", str(config), "--list"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert listed.returncode == 0 and listed.stdout.count("done") == 10


@pytest.mark.parametrize(
    "name",
    [
        "bfcl_arms/bfcl_cpu",
        "bfcl_arms/bfcl_gpu",
        "recipe_search/bfcl_cpu_tune",
        "recipe_search/bfcl_cpu_tune2",
        "bfcl_arms/bfcl_cpu_v2",
    ],
)
def test_the_experiment_configs_parse_unit_by_unit(name: str) -> None:
    """Every fit unit of the shipped grids parses through the CLI (the GPU grid too, on a CPU; every
    variant of the recipe search)."""
    from envace.cli import lightning_cli

    cfg = load_config(str(ROOT / f"studies/{name}.yaml"))
    grid = units(cfg)
    assert len(grid) == 2 + 2 * len(cfg.arms) * len(cfg.seeds)
    before = os.getcwd()
    os.chdir(ROOT)
    try:
        for unit in (u for u in grid if u.kind != "eval" and (u.seed in (None, cfg.seeds[0]))):
            with pytest.raises(SystemExit) as exit_:
                lightning_cli(["fit", *fit_args(cfg, unit), "--print_config"])
            assert exit_.value.code in (0, None), unit.key
    finally:
        os.chdir(before)


def test_a_bad_experiment_config_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbase: configs/bfcl.yaml\narms: [envace]\nevaluation: {splits: [val], nvalues: [0]}\n")
    out = subprocess.run([sys.executable, "-m", "envace.cli", "experiment", "--config", str(bad), "--list"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "evaluation.nvalues" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_variants_and_evaluation_limits_are_checked_and_applied(tmp_path: Path) -> None:
    """An arm ``<overlay>+<variant>`` runs its overlay with the variant's arguments after the shared
    ones; the recipe's arguments reach every run and not the warm start; an unknown variant,
    reference arm or evaluation limit is refused by name."""
    from envace.experiment.evalspec import EvalSpec
    from envace.experiment.grid import ExperimentConfig

    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["real_env+slow"], fit_args=["--a", "1"],
                           variants={"slow": ["--a", "2"]}, reference_arm="real_env+slow")  # fmt: skip
    run = next(u for u in units(cfg) if u.kind == "run")
    args = fit_args(cfg, run)
    assert args[:4] == ["--config", "configs/bfcl.yaml", "--config", "configs/arms/real_env.yaml"]
    assert args.index("2") > args.index("1")  # the variant's value wins over the shared one
    recipe = ExperimentConfig("x", "configs/bfcl.yaml", ["real_env"], fit_args=["--a", "1"], recipe=["--r", "3"],
                              reference_arm="real_env")  # fmt: skip
    warm, run = (next(u for u in units(recipe) if u.kind == kind) for kind in ("warm_start", "run"))
    assert "--r" not in fit_args(recipe, warm)  # the recipe is the runs': the warm start stays the search's
    assert fit_args(recipe, run).index("3") > fit_args(recipe, run).index("1")
    with pytest.raises(ValueError, match="names no variant"):
        ExperimentConfig("x", "b.yaml", ["real_env+fast"], variants={"slow": []}, reference_arm="real_env+fast")
    with pytest.raises(ValueError, match="reference_arm"):
        ExperimentConfig("x", "b.yaml", ["real_env"])
    with pytest.raises(ValueError, match="unknown limit 'max_step'"):
        EvalSpec(limits={"max_step": 20})


@pytest.mark.slow  # the fit's parser, run per arm: seconds each
def test_a_variant_can_be_a_yaml_overlay_checked_by_the_fits_parser(tmp_path: Path, capsys) -> None:
    """A recipe or variant may be a mapping overlay of the fit config (as configs/arms/), beside the
    argument lists: the run's fit reads it as a config, and a key the fit does not have is refused when
    the experiment config is loaded, in one line naming it."""
    from envace.cli import lightning_cli

    config = {
        "name": "overlays", "base": str(ROOT / "configs/smoke.yaml"), "arms": ["real_env+clip", "envace+g3"],
        "reference_arm": "envace+g3", "results": str(tmp_path / "results"), "work": str(tmp_path / "work"),
        "recipe": {"model": {"init_args": {"rl_lr_scale": 0.05}}},
        "variants": {"clip": {"model": {"init_args": {"optim": {"max_grad_norm": 1.0}}}},
                     "g3": ["--model.init_args.group_size", "3"]},
    }  # fmt: skip
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = load_config(str(path))
    model = {}
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        for unit in (u for u in units(cfg) if u.kind == "run" and u.seed == 0):
            capsys.readouterr()
            with pytest.raises(SystemExit) as exit_:
                lightning_cli(["fit", *fit_args(cfg, unit), "--print_config"])
            assert exit_.value.code in (0, None), unit.key
            model[unit.arm] = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]
    finally:
        os.chdir(before)
    clip, g3 = model["real_env+clip"], model["envace+g3"]
    assert clip["rl_lr_scale"] == g3["rl_lr_scale"] == 0.05  # the recipe: every run
    assert clip["optim"]["max_grad_norm"] == 1.0 and clip["responder"]["class_path"].endswith("RealEnvironment")
    assert g3["group_size"] == 3 and g3["optim"]["max_grad_norm"] != 1.0  # an argument list, as before
    config["variants"]["clip"] = {"model": {"init_args": {"optim": {"max_grad_nrom": 1.0}}}}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=r"arm real_env\+clip: .*max_grad_nrom") as refused:
        load_config(str(path))
    assert len(str(refused.value).splitlines()) == 1
    config["variants"]["clip"] = "--model.init_args.optim.max_grad_norm 1"  # neither a list nor a mapping
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="variants.clip: expected a list of envace fit arguments or a mapping"):
        load_config(str(path))


def test_a_killed_attempt_counts_until_its_last_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fit killed with its runner wrote no seconds; the next attempt adds its time (start to the
    last line of fit.log) before it runs, so a resumed run's cost is all its attempts."""
    from envace.experiment import runner

    cfg = load_config(str(tiny_grid(tmp_path)))
    unit = next(u for u in units(cfg) if u.key == "run-envace-s0")
    folder = runner.unit_dir(cfg, unit)
    folder.mkdir(parents=True)
    began = time.time() - 1000
    (folder / runner.OPEN_ATTEMPT).write_text(str(began))
    log = folder / "fit.log"
    log.write_text("step 7 of 16, then SIGKILL\n")
    os.utime(log, (began + 40, began + 40))
    ran: list[list[str]] = []
    monkeypatch.setattr(
        runner.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0)
    )
    runner.run_fit(cfg, unit)
    attempts = json.loads((folder / "attempts.json").read_text())
    assert len(ran) == 1 and attempts[0] == 40.0 and len(attempts) == 2
    assert not (folder / runner.OPEN_ATTEMPT).exists()
    runner.run_fit(cfg, unit)  # a clean attempt adds only itself
    assert len(json.loads((folder / "attempts.json").read_text())) == 3


@pytest.mark.parametrize(
    ("evaluation", "seeds", "why"),
    [
        ({"rehearsal_seeds": [0, 0]}, [0, 1], r"evaluation\.rehearsal_seeds must list distinct seeds"),
        ({"rehearsal_seeds": []}, [0, 1], r"evaluation\.rehearsal_seeds must list distinct seeds \(null: every"),
        ({"rehearsal_seeds": [True]}, [0, 1], r"evaluation\.rehearsal_seeds must list distinct seeds"),
        ({"rehearsal_seeds": 0}, [0, 1], r"evaluation\.rehearsal_seeds must list distinct seeds"),
        ({"rehearsal_seeds": [0], "n_values": [2]}, [0, 1], r"evaluation\.rehearsal_seeds needs a 0 in n_values"),
        ({"rehearsal_seeds": [0, 3]}, [0, 1, 2], r"evaluation\.rehearsal_seeds \[3\] are not among the seeds"),
    ],
)
def test_bad_rehearsal_seeds_are_a_one_line_error(tmp_path: Path, evaluation: dict, seeds: list[int], why: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "base": "configs/bfcl.yaml", "arms": ["envace"], "seeds": seeds,
                                    "evaluation": evaluation}))  # fmt: skip
    with pytest.raises(ValueError, match=why) as info:
        load_config(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_rehearsal_seeds_are_recorded_in_experiment_json() -> None:
    from envace.experiment.evalspec import EvalSpec
    from envace.experiment.grid import ExperimentConfig

    some = ExperimentConfig("x", "b.yaml", ["envace"], seeds=[0, 1, 2], evaluation=EvalSpec(rehearsal_seeds=[0]))
    meta = some.metadata()
    assert meta["rehearsal_seeds"] == [0] and meta["config"]["evaluation"]["rehearsal_seeds"] == [0]
    assert meta["settings"] == ["none", "parallel@2", "sequential@2"]  # the grid's settings: the warm start has all
    every = ExperimentConfig("x", "b.yaml", ["envace"], seeds=[0, 1, 2]).metadata()
    assert "rehearsal_seeds" not in every and every["config"]["evaluation"]["rehearsal_seeds"] is None


def test_a_run_outside_rehearsal_seeds_is_evaluated_with_none_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """evaluate_unit asks ``evaluate`` for every setting for the warm start and the runs of seed 0, and for
    ``none`` alone for the runs of seed 1 (``rehearsal_seeds: [0]``, with the mitigation's settings too)."""
    import dataclasses
    from types import SimpleNamespace

    import envace.evaluation
    import envace.evaluation.policies
    from envace.experiment import evaluate as unit_eval
    from envace.experiment.evalspec import setting_label

    cfg = load_config(str(tiny_grid(tmp_path)))
    spec = dataclasses.replace(cfg.evaluation, reimagine=[0, 1], rehearsal_seeds=[0])
    cfg = dataclasses.replace(cfg, evaluation=spec)
    asked: list[str] = []

    def evaluate(benchmark: str, policy: Any, *, imagination: Any, **kw: Any) -> SimpleNamespace:
        asked.extend(setting_label(s.mode, s.n, s.reimagine) for s in imagination.settings())
        return SimpleNamespace(items=[])

    loaded = SimpleNamespace(tokenizer=None, fmt=None)
    monkeypatch.setattr(envace.evaluation, "evaluate", evaluate)
    monkeypatch.setattr(envace.evaluation.policies, "load_eval_policy", lambda *a, **k: loaded)
    monkeypatch.setattr(unit_eval, "held_out", lambda *a: [])
    monkeypatch.setattr(unit_eval, "gold_fidelity", lambda *a: [])
    settings = {}
    for unit in (u for u in units(cfg) if u.kind == "eval"):
        asked.clear()
        result = unit_eval.evaluate_unit(cfg, unit, tmp_path / "last.ckpt")
        settings[unit.key] = sorted(set(asked))
        assert result["seed"] == unit.seed
    every = ["none", "parallel@2", "parallel@2+reimagine1"]
    assert settings == {"eval-warm_start": every, "eval-envace-s0": every, "eval-real_env-s0": every,
                        "eval-envace-s1": ["none"], "eval-real_env-s1": ["none"]}  # fmt: skip


def test_the_evaluation_samples_as_evaluation_sampling_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``evaluation.sampling`` reaches the evaluation's sampler over the base config's (a grid whose runs
    sample on vLLM evaluates on it too); the temperature stays ``evaluation.temperature``'s, and an
    unknown field is refused by name."""
    import dataclasses
    from types import SimpleNamespace

    import envace.evaluation
    import envace.evaluation.policies
    from envace.experiment import evaluate as unit_eval
    from envace.experiment.evalspec import EvalSpec

    cfg = load_config(str(tiny_grid(tmp_path)))
    spec = dataclasses.replace(cfg.evaluation, sampling={"engine": "vllm", "top_p": 0.9})
    cfg = dataclasses.replace(cfg, evaluation=spec)
    used: list[Any] = []

    def evaluate(benchmark: str, policy: Any, *, sampling: Any, **kw: Any) -> SimpleNamespace:
        used.append(sampling)
        return SimpleNamespace(items=[])

    monkeypatch.setattr(envace.evaluation, "evaluate", evaluate)
    loaded = SimpleNamespace(tokenizer=None, fmt=None)
    monkeypatch.setattr(envace.evaluation.policies, "load_eval_policy", lambda *a, **k: loaded)
    monkeypatch.setattr(unit_eval, "held_out", lambda *a: [])
    monkeypatch.setattr(unit_eval, "gold_fidelity", lambda *a: [])
    unit_eval.evaluate_unit(cfg, next(u for u in units(cfg) if u.kind == "eval"), tmp_path / "last.ckpt")
    assert used and all((s.engine, s.top_p, s.temperature) == ("vllm", 0.9, spec.temperature) for s in used)
    with pytest.raises(ValueError, match="evaluation.sampling: unknown or fixed field 'temperature'"):
        EvalSpec(sampling={"temperature": 1.0})
    with pytest.raises(ValueError, match="'engin'"):
        EvalSpec(sampling={"engin": "vllm"})


def test_a_missing_warm_start_is_restored_from_its_kept_weights_and_checked(tmp_path: Path, monkeypatch) -> None:
    """On a machine without the grid's work folder the warm start comes back from the copy kept with the
    result files, not from a fit run again (another CPU gives other weights); a copy that holds other
    weights than the result file records stops the grid, and nothing is fitted either way."""
    import torch

    from envace.experiment import runner
    from envace.experiment.grid import WARM, ExperimentConfig, write_result

    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["envace"], results=str(tmp_path / "r"),
                           work=str(tmp_path / "w"))  # fmt: skip
    warm = units(cfg)[0]
    assert warm.key == WARM
    state = {"policy.lora_A": torch.arange(6.0).view(2, 3), "reference.lora_A": torch.zeros(2, 3)}
    last = runner.last_checkpoint(cfg, WARM)
    last.parent.mkdir(parents=True)
    torch.save({"state_dict": state, "global_step": 32, "optimizer_states": [{"m": torch.ones(3)}]}, last)
    recorded = runner.fingerprint(last)
    kept = runner.keep_policy(cfg, warm)
    write_result(cfg, warm, {"unit": WARM, "fingerprint": recorded})
    assert set(torch.load(kept, weights_only=True)) == {"state_dict", "global_step"}  # no optimizer
    assert list(torch.load(kept, weights_only=True)["state_dict"]) == ["policy.lora_A"]

    monkeypatch.setattr(runner, "run_fit", lambda *a: pytest.fail("the warm start was fitted again"))
    last.unlink()
    runner.ensure_checkpoint(cfg, warm)
    assert last.is_file() and runner.fingerprint(last) == recorded

    last.unlink()
    torch.save({"state_dict": {"policy.lora_A": torch.ones(2, 3)}, "global_step": 32}, kept)
    with pytest.raises(ValueError, match="holds other weights"):
        runner.ensure_checkpoint(cfg, warm)
    assert not last.exists()


def test_without_a_kept_copy_the_warm_start_is_fitted_again_and_must_give_its_recorded_weights(
    tmp_path: Path, monkeypatch
) -> None:
    """A grid begun before copies were kept, on a machine without its work folder: the warm start's fit
    runs again, and the grid goes on only when it gives the weights the result file records (on the same
    CPU it should; on another one it does not, and the grid stops rather than mix two warm starts)."""
    import torch

    from envace.experiment import runner
    from envace.experiment.grid import WARM, ExperimentConfig, write_result

    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["envace"], results=str(tmp_path / "r"),
                           work=str(tmp_path / "w"))  # fmt: skip
    warm = units(cfg)[0]
    last = runner.last_checkpoint(cfg, WARM)
    last.parent.mkdir(parents=True)
    torch.save({"state_dict": {"policy.lora_A": torch.arange(6.0).view(2, 3)}, "global_step": 32}, last)
    write_result(cfg, warm, {"unit": WARM, "fingerprint": runner.fingerprint(last)})
    fits = []

    def fit_giving(weights: torch.Tensor):
        def fit(*_: object) -> float:
            fits.append(1)
            torch.save({"state_dict": {"policy.lora_A": weights}, "global_step": 32}, last)
            return 1.0

        return fit

    last.unlink()
    monkeypatch.setattr(runner, "run_fit", fit_giving(torch.arange(6.0).view(2, 3)))
    runner.ensure_checkpoint(cfg, warm)
    assert fits == [1] and last.is_file()

    last.unlink()
    monkeypatch.setattr(runner, "run_fit", fit_giving(torch.ones(2, 3)))
    with pytest.raises(ValueError, match="gives other weights"):
        runner.ensure_checkpoint(cfg, warm)


def _saved(path: Path, weights: Any, step: int = 24) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"policy.lora_A": weights}, "global_step": step}, path)


def test_a_missing_run_checkpoint_is_fitted_again_from_its_restored_warm_start(tmp_path: Path, monkeypatch) -> None:
    """A fresh machine, a run done but its checkpoint gone (an eval of it still to do): the run's fit
    runs again, and before it the warm start it starts from comes back from its kept copy; a stale
    checkpoint with other weights, or a rerun killed mid-way, is never taken for the finished one."""
    import torch

    from envace.experiment import runner
    from envace.experiment.grid import WARM, ExperimentConfig, write_result

    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["envace"], results=str(tmp_path / "r"),
                           work=str(tmp_path / "w"))  # fmt: skip
    grid = {u.key: u for u in units(cfg)}
    warm, run = grid[WARM], grid["run-envace-s0"]
    warm_last, run_last = runner.last_checkpoint(cfg, WARM), runner.last_checkpoint(cfg, run.key)
    _saved(warm_last, torch.zeros(2, 3), 32)
    runner.keep_policy(cfg, warm)
    write_result(cfg, warm, {"unit": WARM, "fingerprint": runner.fingerprint(warm_last)})
    _saved(run_last, torch.ones(2, 3))
    write_result(cfg, run, {"unit": run.key, "fingerprint": runner.fingerprint(run_last)})
    warm_last.unlink(), run_last.unlink()
    fits: list[str] = []

    def fit(cfg: ExperimentConfig, unit: Any) -> float:
        assert warm_last.is_file(), "the run was fitted before its warm start was restored"
        fits.append(unit.key)
        _saved(run_last, torch.ones(2, 3))
        return 1.0

    monkeypatch.setattr(runner, "run_fit", fit)
    runner.ensure_checkpoint(cfg, run)
    assert fits == [run.key] and run_last.is_file()

    _saved(run_last, torch.full((2, 3), 2.0))  # a checkpoint left by something else
    with pytest.raises(ValueError, match="holds other weights"):
        runner.ensure_checkpoint(cfg, run)

    (runner.unit_dir(cfg, run) / runner.OPEN_ATTEMPT).write_text("0")  # a rerun killed mid-way: resumed
    runner.ensure_checkpoint(cfg, run)
    assert fits == [run.key, run.key]

    run_last.unlink()
    monkeypatch.setattr(runner, "run_fit", lambda *a: _saved(run_last, torch.full((2, 3), 3.0)) or 1.0)
    with pytest.raises(ValueError, match="gives other weights"):
        runner.ensure_checkpoint(cfg, run)
    assert not run_last.exists() and (run_last.parent / "rerun-other-weights.ckpt").is_file()


def test_a_grid_computes_in_the_precision_its_warm_start_did(tmp_path: Path, monkeypatch) -> None:
    """Units in bf16 beside units in fp32 would differ by more than their arm: on a bf16 CPU a grid begun
    in fp32 goes on in fp32; a bf16 grid on a CPU without native bf16, or a forced other precision, stops."""
    from types import SimpleNamespace

    import envace.hardware
    from envace.experiment.grid import WARM, ExperimentConfig, write_result
    from envace.experiment.machine import pin_numerics

    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["envace"], results=str(tmp_path / "r"),
                           work=str(tmp_path / "w"))  # fmt: skip
    warm = units(cfg)[0]
    monkeypatch.setenv("ENVACE_BF16", "auto")  # detect (and restored after the test)
    native = SimpleNamespace(cpu_bf16=True, reason="avx512_bf16 present")
    monkeypatch.setattr(envace.hardware, "capability", lambda: native)
    pin_numerics(cfg)  # no warm start yet: nothing to follow
    assert os.environ["ENVACE_BF16"] == "auto"

    write_result(cfg, warm, {"unit": WARM, "machine": {"cpu_bf16": False}})
    pin_numerics(cfg)
    assert os.environ["ENVACE_BF16"] == "none"

    monkeypatch.setenv("ENVACE_BF16", "native")
    with pytest.raises(ValueError, match="warm start computed in fp32.*ENVACE_BF16=none"):
        pin_numerics(cfg)

    monkeypatch.setenv("ENVACE_BF16", "auto")
    write_result(cfg, warm, {"unit": WARM, "machine": {"cpu_bf16": True}})
    monkeypatch.setattr(envace.hardware, "capability", lambda: SimpleNamespace(cpu_bf16=False, reason="AVX2"))
    with pytest.raises(ValueError, match="warm start computed in bf16.*ENVACE_BF16=native"):
        pin_numerics(cfg)


def test_a_fit_whose_last_checkpoint_is_short_of_its_steps_records_no_result(tmp_path: Path) -> None:
    """The result of a unit is of the weights it declares: a last checkpoint at step 120 of a
    124-step warm start (Lightning's, before modules saved the final step) is an error, not a result."""
    import dataclasses

    import torch

    from envace.experiment.runner import fit_result, last_checkpoint

    cfg = load_config(str(ROOT / "studies/shopworld/knob-368.yaml"))
    cfg = dataclasses.replace(cfg, work=str(tmp_path))
    (warm,) = [u for u in units(cfg) if u.kind == "warm_start"]
    last = last_checkpoint(cfg, warm.key)
    last.parent.mkdir(parents=True)
    torch.save({"global_step": 120, "state_dict": {}}, last)
    with pytest.raises(RuntimeError, match="last checkpoint is at step 120, not the 124 it ran to"):
        fit_result(cfg, warm)


def test_a_killed_evaluation_resumes_from_its_finished_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two splits, each a part of items and a part of gold fidelity: an attempt killed in the second
    split's fidelity leaves three parts, which the next attempt reads instead of running them; its
    result equals an uninterrupted evaluation's, and parts of other weights are not read."""
    import dataclasses
    from types import SimpleNamespace

    import envace.evaluation
    import envace.evaluation.policies
    from envace.experiment import evaluate as unit_eval

    cfg = load_config(str(tiny_grid(tmp_path)))
    cfg = dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, splits=["val", "test"], n_values=[0]))
    ran: list[str] = []
    killed = {"at": "test"}

    def evaluate(benchmark: str, policy: Any, *, tasks: Any, **kw: Any) -> SimpleNamespace:
        ran.append(f"items {tasks.split}")
        item = SimpleNamespace(category="multi_turn_base", task_id=f"{tasks.split}-1", mode="none", n=0, success=True,
                               score=1.0, details={}, turns=1, flags=set(), calls=[], imagination=[])  # fmt: skip
        return SimpleNamespace(items=[item])

    def gold_fidelity(
        policy: Any, tasks: Any, limits: Any, sampling: Any, split: str, layout: str, first: int = 0
    ) -> list[dict[str, Any]]:
        if killed["at"] == split:
            raise KeyboardInterrupt  # the attempt dies here
        ran.append(f"fidelity {split}")
        return [{"split": split, "task_id": f"{split}-1", "pairs": 1, "value_f1": 0.5}]

    monkeypatch.setattr(envace.evaluation, "evaluate", evaluate)
    loaded = SimpleNamespace(tokenizer=None, fmt=None)
    monkeypatch.setattr(envace.evaluation.policies, "load_eval_policy", lambda *a, **k: loaded)
    monkeypatch.setattr(unit_eval, "held_out", lambda *a: [])
    monkeypatch.setattr(unit_eval, "gold_fidelity", gold_fidelity)
    unit = next(u for u in units(cfg) if u.kind == "eval")
    parts = tmp_path / "parts"
    with pytest.raises(KeyboardInterrupt):
        unit_eval.evaluate_unit(cfg, unit, tmp_path / "last.ckpt", parts)
    assert ran == ["items val", "fidelity val", "items test"] and len(list(parts.glob("*.json"))) == 3
    ran.clear()
    killed["at"] = ""
    resumed = unit_eval.evaluate_unit(cfg, unit, tmp_path / "last.ckpt", parts)
    assert ran == ["fidelity test"]
    ran.clear()
    assert unit_eval.evaluate_unit(cfg, unit, tmp_path / "last.ckpt", tmp_path / "other-weights") == resumed
    assert ran == ["items val", "fidelity val", "items test", "fidelity test"]
