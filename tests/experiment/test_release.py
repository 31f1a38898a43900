"""Released policies: a finished unit's final weights as a bf16 peft adapter folder in the cache's store
(one per fingerprint), and in the results only its record, naming the fingerprint, every file's SHA-256
and the command that makes the folder again; a changed file, a folder not on this machine, a stale
record or a seed outside the grid shows; ``envace experiment --release`` releases what is done and not
yet released, and makes a lost folder again bit for bit."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from envace.experiment import main as experiment
from envace.experiment import release, runner
from envace.experiment.grid import WARM, ExperimentConfig, units, write_result
from envace.policy import LoraSpec, PolicySpec, load_model, load_tokenizer

TARGETS = ["v_proj", "q_proj", "o_proj", "k_proj"]  # adapter_config.json lists them sorted, not in a set's order


@pytest.fixture
def grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ExperimentConfig, Path]:
    """A two-arm grid releasing seed 0, a tiny base model saved as a folder (adapters name it), and the
    store in a cache of the test's own (set after the base is built from the packaged tokenizer)."""
    base = tmp_path / "base"
    load_model(PolicySpec("tiny", seed=1)).save_pretrained(base)
    load_tokenizer("tiny").save_pretrained(base)
    monkeypatch.setenv("ENVACE_CACHE", str(tmp_path / "cache"))
    cfg = ExperimentConfig(
        "x",
        "configs/bfcl.yaml",
        ["envace", "real_env"],
        seeds=[0, 1],
        release_seeds=[0],
        results=str(tmp_path / "r"),
        work=str(tmp_path / "w"),
    )
    monkeypatch.setattr("envace.experiment.load_config", lambda path: cfg)
    return cfg, base


def _finished(cfg: ExperimentConfig, key: str, base: Path, seed: int) -> Path:
    """A finished fit unit: a LoRA checkpoint in its work folder and its result file."""
    spec = PolicySpec(str(base), lora=LoraSpec(r=4, target_modules=TARGETS))
    gen = torch.Generator().manual_seed(seed)
    state = {
        "policy." + n: (torch.randn(p.shape, generator=gen) if "lora_B" in n else p.detach().clone())
        for n, p in load_model(spec).named_parameters()
        if p.requires_grad
    }
    last = runner.last_checkpoint(cfg, key)
    last.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "global_step": 3, "envace": {"policy": dataclasses.asdict(spec)}}, last)
    write_result(cfg, _unit(cfg, key), {"unit": key, "fingerprint": runner.fingerprint(last)})
    return last


def _unit(cfg: ExperimentConfig, key: str):
    return next(u for u in units(cfg) if u.key == key)


def _section(cfg: ExperimentConfig) -> str:
    return "\n".join(release.release_section(cfg.results_dir))


def test_release_seeds_choose_the_warm_start_and_those_runs() -> None:
    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["envace", "real_env"], seeds=[0, 1], release_seeds=[0])
    assert [u.key for u in release.released(cfg)] == [WARM, "run-envace-s0", "run-real_env-s0"]
    assert release.released(dataclasses.replace(cfg, release_seeds=[])) == []
    with pytest.raises(ValueError, match=r"release_seeds \[2\] are not among the seeds"):
        ExperimentConfig("x", "configs/bfcl.yaml", ["envace"], seeds=[0, 1], release_seeds=[2])


def test_the_weights_go_to_the_store_by_fingerprint_and_the_results_hold_only_the_record(tmp_path, grid) -> None:
    cfg, base = grid
    unit = _unit(cfg, "run-envace-s0")
    last = _finished(cfg, unit.key, base, 0)
    fingerprint = runner.fingerprint(last)
    assert not release.is_released(cfg, unit)
    path = release.release_unit(cfg, unit, last, fingerprint, "studies/x.yaml")
    assert path == cfg.results_dir / "policies" / "run-envace-s0.json"
    assert [p.name for p in path.parent.iterdir()] == ["run-envace-s0.json"]  # no folder beside the record
    folder = tmp_path / "cache" / "releases" / fingerprint
    assert release.store_dir(fingerprint) == folder and (folder / release.RECORD).is_file()
    record = json.loads(path.read_text())
    assert record["unit"] == unit.key and record["fingerprint"] == fingerprint and record["dtype"] == "bfloat16"
    assert record["command"] == "envace experiment --config studies/x.yaml --release --unit run-envace-s0"
    assert {"adapter_model.safetensors", "adapter_config.json", "envace_export.json"} <= set(record["sha256"])
    assert "README.md" not in record["sha256"] and (folder / "README.md").is_file()  # release.UNCOMPARED
    assert record["bytes"] == sum((folder / name).stat().st_size for name in record["sha256"])
    assert release.is_released(cfg, unit) and release.check_release(record) == []
    from safetensors.torch import load_file

    assert {v.dtype for v in load_file(folder / "adapter_model.safetensors").values()} == {torch.bfloat16}
    # what would differ between two exports of the same weights: a set's order, the checkpoint's path
    assert json.loads((folder / "adapter_config.json").read_text())["target_modules"] == sorted(TARGETS)
    assert json.loads((folder / "envace_export.json").read_text())["source"] == f"fingerprint {fingerprint}"
    section = _section(cfg)
    row = next(line for line in section.splitlines() if line.startswith("| run-envace-s0 "))
    assert "`policies/run-envace-s0.json`" in row and f"`$ENVACE_CACHE/releases/{fingerprint}/`" in row
    assert record["sha256"]["adapter_model.safetensors"] in row and row.endswith("| files as recorded |")


def test_a_changed_file_in_the_store_and_a_stale_record_show(grid) -> None:
    cfg, base = grid
    unit = _unit(cfg, "run-envace-s0")
    last = _finished(cfg, unit.key, base, 0)
    record = json.loads(release.release_unit(cfg, unit, last, runner.fingerprint(last), "x.yaml").read_text())
    changed = release.store_dir(record["fingerprint"]) / "adapter_config.json"
    changed.write_text("{}")
    digest = record["sha256"]["adapter_config.json"]
    assert release.check_release(record) == [f"{changed}: its SHA-256 is not the recorded {digest[:12]}"]
    assert "| 1 file(s) changed or missing |" in _section(cfg)
    write_result(cfg, unit, {"unit": unit.key, "fingerprint": "0" * 64})  # the unit's weights changed since
    assert not release.is_released(cfg, unit)


def test_a_folder_committed_before_the_store_is_still_named_and_checked(grid) -> None:
    cfg, _ = grid
    folder = cfg.results_dir / "policies" / WARM  # bfcl_cpu_v2's layout: the folder and its record in git
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    digest = release.file_sha256(folder / "adapter_config.json")
    (folder / release.RECORD).write_text(json.dumps({"unit": WARM, "sha256": {"adapter_config.json": digest}}))
    section = _section(cfg)
    assert f"| {WARM} | `policies/{WARM}/release.json` | `policies/{WARM}/` (in git) |" in section
    assert section.count("files as recorded |") == 1 and "committed the folders themselves" in section
    (folder / "adapter_config.json").write_text("[]")
    assert "| 1 file(s) changed or missing |" in _section(cfg)


def test_a_record_whose_folder_is_not_here_says_so_and_how_to_make_it(grid) -> None:
    cfg, base = grid
    unit = _unit(cfg, "run-envace-s0")
    last = _finished(cfg, unit.key, base, 0)
    record = json.loads(release.release_unit(cfg, unit, last, runner.fingerprint(last), "x.yaml").read_text())
    folder = release.store_dir(record["fingerprint"])
    shutil.rmtree(folder)
    command = "envace experiment --config x.yaml --release --unit run-envace-s0"
    assert release.check_release(record) == [f"{folder}: not on this machine; `{command}` makes it again"]
    assert release.is_released(cfg, unit)  # released: the record is committed, the folder can be made again
    assert f"| not on this machine: `{command}` |" in _section(cfg)


def test_release_after_the_store_is_lost_makes_the_same_files_again(grid, capsys) -> None:
    cfg, base = grid
    _finished(cfg, "run-envace-s0", base, 2)
    assert experiment(["--config", "x.yaml", "--release", "--unit", "run-envace-s0"]) == 0
    path = cfg.results_dir / "policies" / "run-envace-s0.json"
    record, stamp = json.loads(path.read_text()), path.stat().st_mtime_ns
    folder = release.store_dir(record["fingerprint"])
    shutil.rmtree(folder)  # another machine, or a cleaned cache: only the committed record is left
    assert experiment(["--config", "x.yaml", "--release", "--unit", "run-envace-s0"]) == 0
    assert release.check_release(record) == [] and path.stat().st_mtime_ns == stamp
    assert f"run-envace-s0: released, {path} ({folder})" in capsys.readouterr().out

    (folder / "adapter_model.safetensors").write_bytes(b"damaged")  # --release makes a damaged folder again
    assert experiment(["--config", "x.yaml", "--release", "--unit", "run-envace-s0"]) == 0
    assert release.check_release(record) == []

    shutil.rmtree(folder)  # an export that is not the released one is an error naming the file
    path.write_text(json.dumps({**record, "sha256": {**record["sha256"], "adapter_config.json": "0" * 64}}))
    with pytest.raises(ValueError, match=r"run-envace-s0: its export is not the released one: .*adapter_config"):
        experiment(["--config", "x.yaml", "--release", "--unit", "run-envace-s0"])


def test_two_grids_releasing_the_same_weights_share_one_folder(tmp_path, grid, monkeypatch) -> None:
    cfg, base = grid
    unit = _unit(cfg, "run-envace-s0")
    last = _finished(cfg, unit.key, base, 0)
    first = json.loads(release.release_unit(cfg, unit, last, runner.fingerprint(last), "a.yaml").read_text())
    other = dataclasses.replace(cfg, name="y", results=str(tmp_path / "r2"))

    def no_export(*args, **kwargs):
        raise AssertionError("the folder of these weights is in the store already")

    monkeypatch.setattr("envace.commands.export.export", no_export)
    second = json.loads(release.release_unit(other, unit, last, runner.fingerprint(last), "b.yaml").read_text())
    assert {k: v for k, v in second.items() if k != "command"} == {k: v for k, v in first.items() if k != "command"}
    assert [p.name for p in (tmp_path / "cache" / "releases").iterdir()] == [first["fingerprint"]]


def test_experiment_release_releases_what_is_done_and_not_yet_released(grid, capsys) -> None:
    cfg, base = grid
    for key, seed in ((WARM, 1), ("run-envace-s0", 2), ("run-envace-s1", 3)):
        _finished(cfg, key, base, seed)
    assert experiment(["--config", "x.yaml", "--release"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (cfg.results_dir / "policies").iterdir()) == ["run-envace-s0.json", f"{WARM}.json"]
    assert "run-real_env-s0: not done" in out
    stamp = (cfg.results_dir / "policies" / f"{WARM}.json").stat().st_mtime_ns
    assert experiment(["--config", "x.yaml", "--release"]) == 0  # nothing new: nothing rewritten
    assert "warm_start: released" in capsys.readouterr().out
    assert (cfg.results_dir / "policies" / f"{WARM}.json").stat().st_mtime_ns == stamp


def test_release_of_one_unit_touches_no_other(grid) -> None:
    cfg, base = grid
    for key, seed in ((WARM, 1), ("run-envace-s0", 2)):
        _finished(cfg, key, base, seed)
    assert experiment(["--config", "x.yaml", "--release", "--unit", WARM]) == 0
    assert [p.name for p in (cfg.results_dir / "policies").iterdir()] == [f"{WARM}.json"]
    with pytest.raises(ValueError, match=r"run-envace-s1 is not released \(release_seeds: \[0\]\)"):
        experiment(["--config", "x.yaml", "--release", "--unit", "run-envace-s1"])
