"""What continuous batching buys in the RL rollout of ``configs/bfcl.yaml``: continuous vs lockstep.

The rollout of an RL step as ``make fit`` runs it (2 training tasks x G = 4 episodes, the policy
acting and rehearsing every tool response, the config's limits and bf16 sampling copy) on a trained
checkpoint, once with ``sampling.continuous`` on and once off, the same seeds on both sides, over
several task pairs (the order of the two sides alternates). Prints one JSON object: per pair the
generated tokens, model forwards, generation seconds and tokens/s of each side, the episodes both
sides wrote token for token, and the median ratio.

    .venv/bin/python studies/performance/rl_rollout.py --checkpoint runs/bfcl/envace/checkpoints/last.ckpt --pairs 6
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from envace.bench.common import make_module, trained_policy
from envace.data.datamodule import EnvACEDataModule
from envace.rollout import RolloutLimits, SamplingConfig

ROOT = Path(__file__).resolve().parents[2]


def settings(config: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's init_args and the data section of a fit config, read as ``envace fit`` reads them."""
    from envace.commands.fit_config import load_fit_config

    cfg = load_fit_config(["--config", str(config)])
    return cfg.model.init_args.as_dict(), cfg.data.as_dict()


def roll(module: Any, tasks: list[Any], continuous: bool, seeds: list[int]) -> dict[str, Any]:
    """One RL-step rollout of ``tasks`` with a fresh engine; its counts and the episodes' ids."""
    module.sampling = dataclasses.replace(module.sampling, continuous=continuous)
    module._engine = None  # a fresh engine: its own stats and caches
    rollout = module.rollout(module.training_responder())
    began = time.perf_counter()
    episodes = rollout.run(tasks, module.group_size, seeds=seeds)
    wall = time.perf_counter() - began
    st = module.engine.stats
    return {
        "tokens": st.tokens,
        "forwards": st.steps,
        "prefills": st.calls,
        "engine_seconds": round(st.seconds, 3),
        "wall_seconds": round(wall, 3),
        "tokens_per_s": round(st.tokens / st.seconds, 2),
        "ids": [ep.ids for ep in episodes],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "bfcl.yaml"))
    parser.add_argument("--checkpoint", default=str(ROOT / "runs" / "bfcl" / "checkpoints" / "last.ckpt"))
    parser.add_argument("--pairs", type=int, default=6, help="task pairs (RL steps) to roll out")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--dtype", default=None, help="override sampling.dtype (float32: both sides write the same tokens)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_args, data_args = settings(Path(args.config))
    name = model_args["policy"]["name_or_path"]
    module = make_module(
        name,
        group_size=model_args["group_size"],
        limits=RolloutLimits(**model_args["limits"]),
        sampling=SamplingConfig(**{**model_args["sampling"], **({"dtype": args.dtype} if args.dtype else {})}),
    )
    module.policy = trained_policy(name, args.checkpoint)
    data = EnvACEDataModule(**{**data_args, "tool_style": model_args["tool_style"], "warm_start": False})
    data.setup("fit")
    step = data_args["tasks_per_step"]
    pairs, out = [], []
    for p in range(args.pairs):
        tasks = data.train_set[p * step : (p + 1) * step]
        seeds = list(range(p * 100, p * 100 + len(tasks) * module.group_size))
        order = [True, False] if p % 2 == 0 else [False, True]
        sides = {("continuous" if c else "lockstep"): roll(module, tasks, c, seeds) for c in order}
        same = sum(a == b for a, b in zip(sides["continuous"].pop("ids"), sides["lockstep"].pop("ids"), strict=True))
        ratio = sides["continuous"]["tokens_per_s"] / sides["lockstep"]["tokens_per_s"]
        pairs.append(ratio)
        out.append({"tasks": [t.id for t in tasks], **sides, "identical_episodes": same, "ratio": round(ratio, 3)})
    report = {
        "config": args.config,
        "checkpoint": args.checkpoint,
        "episodes_per_rollout": step * module.group_size,
        "sampling": dataclasses.asdict(module.sampling),
        "rollouts": out,
        "ratio": {
            "min": round(min(pairs), 3),
            "median": round(statistics.median(pairs), 3),
            "max": round(max(pairs), 3),
        },  # fmt: skip
        "forwards": {side: sum(r[side]["forwards"] for r in out) for side in ("continuous", "lockstep")},
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
