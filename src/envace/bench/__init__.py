"""``envace bench``: throughput and efficiency figures measured in one run, printed as one JSON object.

    envace bench                          # everything, on the packaged model (< 10 minutes on 2 cores)
    envace bench --only training,rollout  # a subset
    envace bench --quick                  # tiny model, small sizes (the test)
    envace bench --only rollout --engine vllm   # vLLM (make vllm) beside our engine, same work

Sections (``--only``): ``peak`` (the machine's matmul peak, always measured: it is the reference),
``training`` (tokens/s and model FLOP utilisation of one EnvACE update), ``rollout`` (generated
tokens/s per role, batched vs one episode at a time), ``layout`` (loss-side tokens, inline vs one
prompt per call), ``trl`` (seconds per optimisation step, ours vs TRL's GRPOTrainer). Figures and
how to read them: ``docs/performance.md``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from contextlib import redirect_stdout
from typing import Any

SECTIONS = ("peak", "training", "rollout", "layout", "trl")


def parse_args(argv: list[str] | None) -> Any:
    """The options of ``envace bench`` (a jsonargparse ``Namespace``), with ``sections`` the list ``--only`` names."""
    from envace.commands.usage import command_parser

    parser = command_parser("envace bench", (__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="tiny model and small sizes (seconds, for tests)")
    parser.add_argument("--model", default=None, help="policy to measure (null: smollm2-135m; tiny with --quick)")
    parser.add_argument(
        "--checkpoint", default=None,
        help="a Lightning checkpoint of --model (e.g. after `make fit`): its weights (LoRA merged) are measured; "
        "the rollout figures depend on what the policy writes",
    )  # fmt: skip
    parser.add_argument(
        "--engine", default="envace", choices=("envace", "vllm"),
        help="rollout section: our engine's levers (envace), or vLLM beside our engine on the same work (vllm: "
        "needs `make vllm`; one server start per sampling dtype)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the reference peak uses the same)")
    parser.add_argument("--out", default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    return args


def machine_facts() -> dict[str, Any]:
    """The CPU, and what :mod:`envace.hardware` detected and chose on it (the precisions the bench runs)."""
    from envace import hardware

    return {
        "machine": platform.machine(),
        "cpu": hardware.cpu_model(),
        "logical_cpus": os.cpu_count(),
        "capability": hardware.capability().as_dict(),
        "chosen": {
            "trainer.precision": hardware.training_precision("auto"),
            "sampling.dtype": hardware.sampling_dtype("auto") or "float32",
        },  # fmt: skip
    }


def run(args: Any) -> dict[str, Any]:
    """Measure the requested sections; returns the JSON object."""
    import torch

    from envace import hardware
    from envace.bench import common
    from envace.bench.peak import measure_peak, merge_peaks

    sizes = common.QUICK if args.quick else common.Sizes()
    model = args.model or sizes.model
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    result = _header(args, model)
    bf16 = hardware.native_bf16()  # bf16 figures only where the CPU computes it (elsewhere ~100x slower)
    peaks = [measure_peak(sizes.peak_sizes, bf16=bf16)]
    _log("peak", peaks[0])
    module = common.make_module(model) if {"training", "rollout", "layout"} & set(args.sections) else None
    if module is not None and args.checkpoint:
        module.policy = common.trained_policy(model, args.checkpoint)
        result["checkpoint"] = args.checkpoint
    if "training" in args.sections:
        from envace.bench.training import bench_training

        dtypes = ("fp32", "bf16") if bf16 else ("fp32",)
        result["training"] = bench_training(
            module, common.bfcl_tasks(), sizes.train_tokens, sizes.train_reps, min(1024, max(sizes.peak_sizes)), dtypes
        )
        peaks.append(measure_peak(sizes.peak_sizes, bf16=bf16))
        _log("training", result["training"])
    if "rollout" in args.sections:
        result["rollout"] = _rollout(module, sizes, args.engine, bf16)
        _log("rollout", result["rollout"])
    if "layout" in args.sections:
        from envace.bench.layout import bench_layout

        result["layout"] = bench_layout(module, common.bfcl_tasks()[: sizes.layout_tasks])
        _log("layout", result["layout"])
    del module
    if "trl" in args.sections:
        from envace.bench.versus_trl import bench_trl

        result["trl"] = bench_trl(model, sizes.trl_runs, sizes.trl_group, sizes.trl_tokens)
        peaks.append(measure_peak(sizes.peak_sizes, bf16=bf16))
        _log("trl", result["trl"])
    result["peak"] = merge_peaks(*peaks)
    if "training" in result:
        from envace.bench.training import add_utilisation

        add_utilisation(result["training"], result["peak"])
    result["seconds"] = round(time.perf_counter() - began, 1)
    return result


def _header(args: Any, model: str) -> dict[str, Any]:
    """What was measured, how, and on which machine: the JSON object's first fields."""
    import torch

    return {
        "command": "envace bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
        "quick": args.quick,
        "model": model,
        "sections": args.sections,
        "machine": {
            **machine_facts(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (the OpenMP runtime's default)"),
        },
    }


def _rollout(module: Any, sizes: Any, engine: str, bf16: bool) -> dict[str, Any]:
    """The rollout section: our engine's levers, or (``engine == "vllm"``) vLLM beside our engine."""
    from envace.bench import common

    task = rollout_task(module, common.bfcl_tasks(sizes.user_turns))
    if engine == "vllm":
        from envace.bench.vllm import bench_vllm, default_dtypes

        dtypes = default_dtypes(bf16)
        return bench_vllm(module, task, sizes.group_size, sizes.act_tokens, sizes.rehearse_tokens, dtypes)
    from envace.bench.rollout import bench_rollout

    return bench_rollout(module, task, sizes.group_size, sizes.act_tokens, sizes.rehearse_tokens, bf16_sampling=bf16)


def rollout_task(module: Any, tasks: list[Any]) -> Any:
    """The task with the shortest system turn among those with gold calls on every kept user turn."""
    from envace.protocol.tokens import PieceEncoder

    encode = PieceEncoder(module.tokenizer)
    usable = [t for t in tasks if t.gold and all(t.gold)]
    return min(usable, key=lambda t: len(encode(module.fmt.system(t.system_prompt, t.tools))))


def _log(section: str, value: Any) -> None:
    print(f"[bench] {section}: {json.dumps(value, default=str)[:400]}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``envace bench``: prints one JSON object on stdout (progress goes to stderr)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    with redirect_stdout(sys.stderr):  # libraries print progress (TRL prints its logs): stdout is the JSON only
        result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0
