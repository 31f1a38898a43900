"""A grid's released policies: the warm start's and each released seed's final weights as bf16 peft
adapter folders beside the result files, so that anyone can evaluate them without retraining.

``<results>/policies/<unit>/`` is ``envace export --adapters --dtype bfloat16`` of the unit's final
checkpoint (a few MB for LoRA r = 16 on SmolLM2-135M) plus ``release.json``: the unit, the
fingerprint of the weights it was exported from (the one its result file records) and the SHA-256 of
every file in the folder, which the report names. The runner releases a unit as soon as its fit
ends (:func:`release_unit`); ``envace experiment --release`` releases the finished ones not yet
released, after :func:`~envace.experiment.runner.ensure_checkpoint` has brought back (or refitted
and checked) each checkpoint the work folder lost.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from envace.experiment.grid import WARM, ExperimentConfig, Unit, is_done, result_path, units

DTYPE = "bfloat16"
RECORD = "release.json"


def released(cfg: ExperimentConfig) -> list[Unit]:
    """The fit units whose policies the grid releases: the warm start and the runs of ``release_seeds``
    (none without them)."""
    if not cfg.release_seeds or cfg.policies_from is not None:
        return []
    return [u for u in units(cfg) if u.kind == WARM or (u.kind == "run" and u.seed in cfg.release_seeds)]


def release_dir(cfg: ExperimentConfig, unit: Unit) -> Path:
    return cfg.results_dir / "policies" / unit.key


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def release_record(folder: Path) -> dict[str, Any] | None:
    """The folder's ``release.json``, or ``None`` when it has none (not released, or half-written)."""
    path = folder / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def is_released(cfg: ExperimentConfig, unit: Unit) -> bool:
    """Released from the weights the unit's result file records (a stale folder does not count)."""
    record = release_record(release_dir(cfg, unit))
    if record is None or not is_done(cfg, unit):
        return False
    return record.get("fingerprint") == json.loads(result_path(cfg, unit).read_text()).get("fingerprint")


def release_unit(cfg: ExperimentConfig, unit: Unit, checkpoint: Path, fingerprint: str) -> Path:
    """Export ``checkpoint`` (the unit's final one, whose policy weights hash to ``fingerprint``) as the
    unit's bf16 adapter folder, and record its checksums; the record is written last, so a folder
    without one is an interrupted release."""
    from envace.commands.export import export

    folder = release_dir(cfg, unit)
    export(str(checkpoint), str(folder), adapters=True, force=True, dtype=DTYPE)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD)
    record = {
        "unit": unit.key,
        "fingerprint": fingerprint,
        "dtype": DTYPE,
        "sha256": {str(p.relative_to(folder)): file_sha256(p) for p in files},
        "bytes": sum(p.stat().st_size for p in files),
    }
    (folder / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return folder


def check_release(folder: Path) -> list[str]:
    """What is wrong with a released folder: files missing or changed against its record (empty: sound)."""
    record = release_record(folder)
    if record is None:
        return [f"{folder}: no {RECORD}"]
    problems = []
    for name, digest in sorted(record.get("sha256", {}).items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif file_sha256(path) != digest:
            problems.append(f"{path}: its SHA-256 is not the recorded {digest[:12]}")
    return problems


def release_section(results_dir: Path) -> list[str]:
    """The report's lines naming each released policy folder, its source weights and its checksums
    (none when the grid released nothing)."""
    folders = sorted(p.parent for p in (results_dir / "policies").glob(f"*/{RECORD}"))
    if not folders:
        return []
    lines = ["## Released policies", "",
             "Each policy's final weights as a peft adapter folder in bf16 (`envace export --adapters --dtype "
             "bfloat16`), under `policies/<unit>/`: load it with `peft.AutoPeftModelForCausalLM.from_pretrained` "
             "(its base, `adapter_config.json`'s `base_model_name_or_path`, and the note in `envace_export.json`). "
             "`fingerprint` is the SHA-256 of the fp32 weights it was rounded from, as the unit's result file "
             "records; `sha256` the adapter weights' file as released (`release.json` holds every file's).", "",
             "| unit | fingerprint | adapter_model.safetensors sha256 | bytes (all files) | check |",
             "|---|---|---|---|---|"]  # fmt: skip
    for folder in folders:
        record = release_record(folder) or {}
        weights = record.get("sha256", {}).get("adapter_model.safetensors", "—")
        problems = check_release(folder)
        check = "files as recorded" if not problems else f"{len(problems)} file(s) changed or missing"
        lines.append(f"| {record.get('unit', folder.name)} | `{str(record.get('fingerprint'))[:12]}` | `{weights}` "
                     f"| {record.get('bytes', 0):,} | {check} |")  # fmt: skip
    return [*lines, ""]
