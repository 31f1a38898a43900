"""Do our engine and vLLM sample the same policy alike? Their RL rewards on the same tasks, same weights.

The RL rollout of ``configs/bfcl.yaml`` (G episodes per task, the policy acting and rehearsing every
tool response, the config's limits and sampler, temperature 1) from one checkpoint, run once on our
engine and once on a vLLM server, over the same training tasks; every episode scored by the
training reward (the start-up of vLLM's server is in its wall time). The engines draw from different
random streams, so single episodes differ; the question is whether their reward distributions do.
Prints one JSON object: per engine the mean reward, truncation rate, format errors per episode and
wall time; per task both engines' mean rewards; and the difference of the means (vLLM − ours)
paired by task with a 95 % interval (Student's t over the task differences).

    .venv/bin/python studies/engine_fits/engine_rewards.py --checkpoint <warm start>.ckpt --tasks 24
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
from compare_fits import paired  # scripts/: the same paired interval as the fit comparison's

from envace.bench.common import make_module, trained_policy
from envace.commands.fit_config import load_fit_config
from envace.data.datamodule import EnvACEDataModule
from envace.rollout import RolloutLimits, SamplingConfig
from envace.types import TRUNCATED

ROOT = Path(__file__).resolve().parents[2]


def roll(module: Any, tasks: list[Any]) -> dict[str, Any]:
    """One rollout of every task's group on the module's engine, as an RL step rolls out (the policy
    acts and rehearses); per-episode rewards and counts."""
    began = time.perf_counter()
    episodes = module.run_episodes(tasks, module.group_size, module.training_responder()).episodes
    wall = time.perf_counter() - began
    rewards = [module.reward(ep).score for ep in episodes]
    return {
        "rewards": rewards,
        "truncated": sum(TRUNCATED in ep.flags for ep in episodes) / len(episodes),
        "format_errors": sum(ep.format_errors for ep in episodes) / len(episodes),
        "wall_seconds": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "bfcl.yaml"))
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tasks", type=int, default=24, help="training tasks, G episodes each")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_fit_config(["--config", args.config])  # as envace fit reads it
    model_args, data_args = cfg.model.init_args.as_dict(), cfg.data.as_dict()
    name = model_args["policy"]["name_or_path"]
    data = EnvACEDataModule(**{**data_args, "tool_style": model_args["tool_style"], "warm_start": False})
    data.setup("fit")
    tasks = data.train_set[: args.tasks]
    policy = trained_policy(name, args.checkpoint)
    out: dict[str, Any] = {"config": args.config, "checkpoint": args.checkpoint, "tasks": [t.id for t in tasks]}
    for engine in ("envace", "vllm"):
        sampling = SamplingConfig(**{**model_args["sampling"], "engine": engine})
        module = make_module(name, group_size=model_args["group_size"], limits=RolloutLimits(**model_args["limits"]),
                             sampling=sampling)  # fmt: skip
        module.policy = policy
        out[engine] = roll(module, tasks)
        out[engine]["sampling"] = dataclasses.asdict(module.sampling)["dtype"]
        del module
    g = model_args["group_size"]
    per_task = {
        e: [statistics.mean(out[e]["rewards"][i * g : (i + 1) * g]) for i in range(len(tasks))]
        for e in ("envace", "vllm")
    }
    m, lo, hi = paired(per_task["envace"], per_task["vllm"])
    out["per_task"] = per_task
    out["mean_reward"] = {e: round(statistics.mean(out[e]["rewards"]), 4) for e in ("envace", "vllm")}
    out["vllm_minus_ours"] = {"mean": round(m, 4), "ci95": [round(lo, 4), round(hi, 4)], "tasks": len(tasks)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
