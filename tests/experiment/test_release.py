"""Released policies: a finished unit's final weights as a bf16 peft adapter folder whose record names
the weights it came from and every file's SHA-256; a changed file, a stale folder or a seed outside the
grid shows; ``envace experiment --release`` releases what is done and not yet released."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from envace.experiment import main as experiment
from envace.experiment import release, runner
from envace.experiment.grid import WARM, ExperimentConfig, units, write_result
from envace.policy import LoraSpec, PolicySpec, load_model, load_tokenizer


def _grid(tmp: Path) -> tuple[ExperimentConfig, Path]:
    """A two-arm grid releasing seed 0, and a tiny base model saved as a folder (adapters name it)."""
    base = tmp / "base"
    load_model(PolicySpec("tiny", seed=1)).save_pretrained(base)
    load_tokenizer("tiny").save_pretrained(base)
    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["envace", "real_env"], seeds=[0, 1], release_seeds=[0],
                           results=str(tmp / "r"), work=str(tmp / "w"))  # fmt: skip
    return cfg, base


def _finished(cfg: ExperimentConfig, key: str, base: Path, seed: int) -> Path:
    """A finished fit unit: a LoRA checkpoint in its work folder and its result file."""
    spec = PolicySpec(str(base), lora=LoraSpec(r=4, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(seed)
    state = {"policy." + n: (torch.randn(p.shape, generator=gen) if "lora_B" in n else p.detach().clone())
             for n, p in load_model(spec).named_parameters() if p.requires_grad}  # fmt: skip
    last = runner.last_checkpoint(cfg, key)
    last.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "global_step": 3, "envace": {"policy": dataclasses.asdict(spec)}}, last)
    unit = next(u for u in units(cfg) if u.key == key)
    write_result(cfg, unit, {"unit": key, "fingerprint": runner.fingerprint(last)})
    return last


def test_release_seeds_choose_the_warm_start_and_those_runs() -> None:
    cfg = ExperimentConfig("x", "configs/bfcl.yaml", ["envace", "real_env"], seeds=[0, 1], release_seeds=[0])
    assert [u.key for u in release.released(cfg)] == [WARM, "run-envace-s0", "run-real_env-s0"]
    assert release.released(dataclasses.replace(cfg, release_seeds=[])) == []
    with pytest.raises(ValueError, match=r"release_seeds \[2\] are not among the seeds"):
        ExperimentConfig("x", "configs/bfcl.yaml", ["envace"], seeds=[0, 1], release_seeds=[2])


def test_a_released_folder_records_its_source_and_checksums_and_a_change_shows(tmp_path: Path) -> None:
    cfg, base = _grid(tmp_path)
    unit = next(u for u in units(cfg) if u.key == "run-envace-s0")
    last = _finished(cfg, unit.key, base, 0)
    assert not release.is_released(cfg, unit)
    folder = release.release_unit(cfg, unit, last, runner.fingerprint(last))
    record = json.loads((folder / release.RECORD).read_text())
    assert record["unit"] == unit.key and record["fingerprint"] == runner.fingerprint(last)
    assert {"adapter_model.safetensors", "adapter_config.json", "envace_export.json"} <= set(record["sha256"])
    assert release.is_released(cfg, unit) and release.check_release(folder) == []
    from safetensors.torch import load_file

    assert {v.dtype for v in load_file(folder / "adapter_model.safetensors").values()} == {torch.bfloat16}
    section = "\n".join(release.release_section(cfg.results_dir))
    assert record["sha256"]["adapter_model.safetensors"] in section and "files as recorded" in section

    (folder / "adapter_config.json").write_text("{}")
    assert release.check_release(folder) == [f"{folder / 'adapter_config.json'}: its SHA-256 is not the recorded "
                                             f"{record['sha256']['adapter_config.json'][:12]}"]  # fmt: skip
    assert "1 file(s) changed or missing" in "\n".join(release.release_section(cfg.results_dir))
    write_result(cfg, unit, {"unit": unit.key, "fingerprint": "0" * 64})  # the unit's weights changed since
    assert not release.is_released(cfg, unit)


def test_experiment_release_releases_what_is_done_and_not_yet_released(tmp_path: Path, monkeypatch, capsys) -> None:
    cfg, base = _grid(tmp_path)
    for key, seed in ((WARM, 1), ("run-envace-s0", 2), ("run-envace-s1", 3)):
        _finished(cfg, key, base, seed)
    monkeypatch.setattr("envace.experiment.load_config", lambda path: cfg)
    assert experiment(["--config", "x.yaml", "--release"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (cfg.results_dir / "policies").iterdir()) == ["run-envace-s0", WARM]
    assert "run-real_env-s0: not done" in out
    stamp = (cfg.results_dir / "policies" / WARM / release.RECORD).stat().st_mtime_ns
    assert experiment(["--config", "x.yaml", "--release"]) == 0  # nothing new: nothing rewritten
    assert "warm_start: released" in capsys.readouterr().out
    assert (cfg.results_dir / "policies" / WARM / release.RECORD).stat().st_mtime_ns == stamp


def test_release_of_one_unit_touches_no_other(tmp_path: Path, monkeypatch, capsys) -> None:
    cfg, base = _grid(tmp_path)
    for key, seed in ((WARM, 1), ("run-envace-s0", 2)):
        _finished(cfg, key, base, seed)
    monkeypatch.setattr("envace.experiment.load_config", lambda path: cfg)
    assert experiment(["--config", "x.yaml", "--release", "--unit", WARM]) == 0
    assert [p.name for p in (cfg.results_dir / "policies").iterdir()] == [WARM]
    with pytest.raises(ValueError, match=r"run-envace-s1 is not released \(release_seeds: \[0\]\)"):
        experiment(["--config", "x.yaml", "--release", "--unit", "run-envace-s1"])
