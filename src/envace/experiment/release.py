"""A grid's released policies: the warm start's and each released seed's final weights as bf16 peft
adapter folders that anyone can evaluate without retraining, kept outside git; the repository holds
only each one's small record.

* The folder is ``$ENVACE_CACHE/releases/<fingerprint>/`` (:func:`store_dir`): ``envace export
  --adapters --dtype bfloat16`` of the unit's final checkpoint (a few MB for LoRA r = 16 on
  SmolLM2-135M) and its ``release.json`` (fingerprint, dtype, every file's SHA-256, bytes), written
  last. ``fingerprint`` is the SHA-256 of the fp32 policy weights the unit's result file records, so
  there is one folder per set of weights, shared by every grid that releases them.
* The record is ``<results>/policies/<unit>.json`` (:func:`record_path`), committed with the result
  file: the unit, the fingerprint, the dtype, every file's SHA-256, the bytes and the command that
  makes the folder again (``envace experiment --config <config> --release --unit <unit>``). It is
  written last: a unit without one is not released.

The export is bit-identical wherever the same versions run it: bf16 rounds fixed fp32 weights the same
way on every CPU, ``adapter_config.json`` lists its target modules sorted (peft saves a set) and
``envace_export.json`` names the weights by fingerprint, not by the checkpoint's path. One file is left
out of the compared set (:data:`UNCOMPARED`): peft's ``README.md``, a blank model card whose
``base_model`` is the path this machine loaded the base weights from (its cache). A release from a
record whose folder is gone (another machine, a cleaned cache) exports again and must give the
recorded checksums (:func:`release_unit`); the runner releases a unit as soon as its fit ends, and
``envace experiment --release`` releases the finished ones not yet released or whose folder is not
here, after :func:`~envace.experiment.runner.ensure_checkpoint` has brought back each checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from envace.experiment.grid import WARM, ExperimentConfig, Unit, is_done, result_path, units, write_json
from envace.paths import cache_dir

DTYPE = "bfloat16"
RECORD = "release.json"
STORE = "releases"
#: files of the exported folder whose SHA-256 is not recorded, each with its reason
UNCOMPARED = {"README.md": "peft's blank model card: its base_model is this machine's path of the base weights"}


def released(cfg: ExperimentConfig) -> list[Unit]:
    """The fit units whose policies the grid releases: the warm start and the runs of ``release_seeds``
    (none without them)."""
    if not cfg.release_seeds or cfg.policies_from is not None:
        return []
    return [u for u in units(cfg) if u.kind == WARM or (u.kind == "run" and u.seed in cfg.release_seeds)]


def store_dir(fingerprint: str) -> Path:
    """The released folder of the weights whose fp32 SHA-256 is ``fingerprint``, in the cache."""
    return cache_dir() / STORE / fingerprint


def record_path(cfg: ExperimentConfig, unit: Unit) -> Path:
    return cfg.results_dir / "policies" / f"{unit.key}.json"


def release_command(config: str, unit: Unit) -> str:
    """What makes a unit's released folder again, on any machine with the repository.

    >>> release_command("studies/x.yaml", Unit("warm_start", "warm_start", "warm_start"))
    'envace experiment --config studies/x.yaml --release --unit warm_start'
    """
    return f"envace experiment --config {config} --release --unit {unit.key}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: Path) -> dict[str, Any] | None:
    """A record (or a folder's ``release.json``), or ``None`` when there is none."""
    return json.loads(path.read_text()) if path.is_file() else None


def recorded_fingerprint(cfg: ExperimentConfig, unit: Unit) -> str | None:
    """The fingerprint the unit's result file records (``None``: not done)."""
    return json.loads(result_path(cfg, unit).read_text()).get("fingerprint") if is_done(cfg, unit) else None


def is_released(cfg: ExperimentConfig, unit: Unit) -> bool:
    """Its record is committed and names the weights its result file records (a stale record does not
    count); whether the folder is on this machine is :func:`check_release`'s question."""
    record = read_json(record_path(cfg, unit))
    return record is not None and record.get("fingerprint") == recorded_fingerprint(cfg, unit)


def compare(folder: Path, sha256: dict[str, str]) -> list[str]:
    """The files of ``folder`` missing or changed against ``sha256`` (name -> digest); empty: as recorded."""
    problems = []
    for name, digest in sorted(sha256.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif file_sha256(path) != digest:
            problems.append(f"{path}: its SHA-256 is not the recorded {digest[:12]}")
    return problems


def check_release(record: dict[str, Any]) -> list[str]:
    """What is wrong with a record's released folder here: its files missing or changed against the
    record, or one line saying it is not on this machine and the command that makes it (empty: sound)."""
    folder = store_dir(str(record.get("fingerprint")))
    if not folder.is_dir():
        return [f"{folder}: not on this machine; `{record.get('command')}` makes it again"]
    return compare(folder, record.get("sha256", {}))


def export_folder(checkpoint: Path, fingerprint: str) -> Path:
    """The store folder of ``fingerprint``: kept when its files are as its ``release.json`` says, else
    exported from ``checkpoint`` (whose policy weights hash to ``fingerprint``), ``release.json`` last."""
    from envace.commands.export import export

    folder = store_dir(fingerprint)
    made = read_json(folder / RECORD)
    if made is not None and made.get("fingerprint") == fingerprint and not compare(folder, made["sha256"]):
        return folder
    export(str(checkpoint), str(folder), adapters=True, force=True, dtype=DTYPE, source=f"fingerprint {fingerprint}")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD and p.name not in UNCOMPARED)
    write_json(
        folder / RECORD,
        {
            "fingerprint": fingerprint,
            "dtype": DTYPE,
            "sha256": {str(p.relative_to(folder)): file_sha256(p) for p in files},
            "bytes": sum(p.stat().st_size for p in files),
        },
    )
    return folder


def release_unit(cfg: ExperimentConfig, unit: Unit, checkpoint: Path, fingerprint: str, config: str) -> Path:
    """Release ``checkpoint`` (the unit's final one, whose policy weights hash to ``fingerprint``) into
    the store and write its record, last; returns the record.

    A record of the same fingerprint is already committed (the folder was lost): the folder made again
    must hold the recorded checksums, else a ``ValueError`` names the files that differ and the record
    stays as it was."""
    path = record_path(cfg, unit)
    committed = read_json(path)
    folder = export_folder(checkpoint, fingerprint)
    made = read_json(folder / RECORD) or {}
    if committed is not None and committed.get("fingerprint") == fingerprint:
        problems = compare(folder, committed.get("sha256", {}))
        if problems:
            raise ValueError(f"{unit.key}: its export is not the released one: {'; '.join(problems)}")
        return path
    record = {"unit": unit.key, **made, "command": release_command(config, unit)}
    return write_json(path, record)


def released_folders(results_dir: Path) -> list[tuple[str, dict[str, Any], Path, str]]:
    """Each released policy of a results folder: its record's name there, the record, its folder and how
    the report names that folder. Records are ``policies/<unit>.json`` with the folder in the store; a
    grid released before the store (bfcl_cpu_v2) committed the folders, ``policies/<unit>/release.json``."""
    policies = results_dir / "policies"
    found = []
    for path in sorted(policies.glob("*.json")):
        record = read_json(path) or {}
        fingerprint = str(record.get("fingerprint"))
        found.append((path.name, record, store_dir(fingerprint), f"`$ENVACE_CACHE/{STORE}/{fingerprint}/`"))
    for path in sorted(policies.glob(f"*/{RECORD}")):
        unit = path.parent.name
        found.append((f"{unit}/{RECORD}", read_json(path) or {}, path.parent, f"`policies/{unit}/` (in git)"))
    return found


def release_section(results_dir: Path) -> list[str]:
    """The report's lines naming each record, its folder in the store and whether that folder is here
    with the recorded files (none when the grid released nothing)."""
    found = released_folders(results_dir)
    if not found:
        return []
    lines = [
        "## Released policies",
        "",
        "Each policy's final weights as a peft adapter folder in bf16 (`envace export --adapters --dtype "
        "bfloat16`), kept outside git in `$ENVACE_CACHE/releases/<fingerprint>/` (default cache "
        "`~/.cache/envace`); the repository holds its record, `policies/<unit>.json`, with every file's "
        "SHA-256 and the command that makes the folder again, bit for bit. Load it with "
        "`peft.AutoPeftModelForCausalLM.from_pretrained` (its base, `adapter_config.json`'s "
        "`base_model_name_or_path`, and the note in `envace_export.json`). `<fingerprint>` is the SHA-256 of "
        "the fp32 weights it was rounded from, as the unit's result file records; `check` whether the "
        "folder is on the machine that wrote this report, with the recorded files.",
        "",
        "| unit | record | folder | adapter_model.safetensors sha256 | bytes | check |",
        "|---|---|---|---|---|---|",
    ]
    if any(folder.parent == results_dir / "policies" for _, _, folder, _ in found):
        lines[2] += " A grid released before the store committed the folders themselves (`policies/<unit>/`)."
    for name, record, folder, shown in found:
        weights = record.get("sha256", {}).get("adapter_model.safetensors", "—")
        lines.append(
            f"| {record.get('unit', name)} | `policies/{name}` | {shown} | `{weights}` "
            f"| {record.get('bytes', 0):,} | {check_cell(record, folder)} |"
        )
    return [*lines, ""]


def check_cell(record: dict[str, Any], folder: Path) -> str:
    """A released folder's check state against its record, in one table cell."""
    if not folder.is_dir():
        return f"not on this machine: `{record.get('command')}`"
    problems = compare(folder, record.get("sha256", {}))
    return f"{len(problems)} file(s) changed or missing" if problems else "files as recorded"
