"""What skipping the backward of flat GRPO groups saves: seconds of one RL-shaped update of the packaged
model (``configs/bfcl.yaml``'s LoRA), with and without ``still`` rows, by the share of groups whose
rewards do not vary (their advantages, hence their gradients, are exactly zero).

The batch is an RL step of the search's recipe (docs/training.md): 4 tasks x G = 4 grounded BFCL
episodes of at most ``--tokens`` tokens. A flat group gets one reward for all its members, a varying
group alternates 0 and 1. Both variants run in this process, alternated, ``--repeats`` times each, so
that their ratio is measured under the same load; the gradients of the two are compared too. Prints
one JSON object.

    .venv/bin/python studies/performance/still_rows.py                      # flat groups 0, 2, 3 of 4
    .venv/bin/python studies/performance/still_rows.py --flat 3 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from functools import partial
from typing import Any

import torch

from envace.data.batch import collate_episodes
from envace.data.grounding import ground
from envace.losses import LossInputs
from envace.modules import EnvACEModule
from envace.modules.logprobs import backward_in_chunks
from envace.policy import LoraSpec, PolicySpec
from envace.protocol.tokens import PieceEncoder, encode_trajectory

LORA = LoraSpec(r=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"])  # fmt: skip


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "")
    kinds = [k for k in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if f" {k}" in flags]
    return f"{platform.processor() or platform.machine()} ({', '.join(kinds) or 'no AVX'})"


def _loss(loss: Any, inputs: LossInputs, logprobs: torch.Tensor) -> Any:
    return loss(inputs._replace(logprobs=logprobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flat", default="0,2,3", help="flat groups of the 4, one setting each")
    parser.add_argument("--tokens", type=int, default=1400, help="most tokens per episode")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from envace.bench.common import bfcl_tasks

    torch.manual_seed(0)
    torch.set_num_threads(2)
    module = EnvACEModule(policy=PolicySpec("smollm2-135m", lora=LORA), tool_style="compact")
    module.configure_model()
    encode = PieceEncoder(module.tokenizer)
    episodes = []
    for task in [t for t in bfcl_tasks() if t.gold][: args.groups]:
        ep = encode_trajectory(ground(task), encode, module.fmt)
        episodes += [ep.tensors() for _ in range(args.group_size)]
    batch = collate_episodes(episodes, module.tokenizer.pad_token_id)
    batch = batch._replace(**{k: getattr(batch, k)[:, : args.tokens] for k in batch._fields})
    rows = batch.input_ids.shape[0]
    params = [p for p in module.parameters() if p.requires_grad]
    settings: dict[str, dict[str, object]] = {}
    for flat in [int(x) for x in args.flat.split(",")]:
        group = torch.arange(rows) // args.group_size
        rewards = torch.where(group < flat, 1.0, (torch.arange(rows) % 2).float())
        inputs = LossInputs(batch.logprobs, batch.logprobs, batch.roles, batch.loss_mask, rewards, group)
        still = module.loss.still_rows(inputs)
        seconds: dict[str, list[float]] = {"all rows": [], "still rows skipped": []}
        grads: dict[str, list[torch.Tensor]] = {}
        for _ in range(args.repeats):
            for variant, mark in (("all rows", None), ("still rows skipped", still)):
                module.zero_grad(set_to_none=True)
                began = time.perf_counter()
                backward_in_chunks(module._logprobs, batch, partial(_loss, module.loss, inputs), module._chunk_tokens(),
                                   prefix_of=module._prefix, still=mark)  # fmt: skip
                seconds[variant].append(round(time.perf_counter() - began, 1))
                grads[variant] = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        diff = max(
            (a - b).abs().max().item() for a, b in zip(grads["all rows"], grads["still rows skipped"], strict=True)
        )
        best = {k: min(v) for k, v in seconds.items()}
        name = f"{flat}/{args.groups} groups flat"
        settings[name] = {
            "still rows": int(still.sum()),
            "seconds": seconds,
            "ratio (skipped / all, best of each)": round(best["still rows skipped"] / best["all rows"], 3),
            "max |grad difference|": diff,
        }
        print(f"{name}: {settings[name]}", flush=True)
    tokens = int(batch.attention_mask.sum())
    print(json.dumps({"cpu": _cpu(), "rows": rows, "tokens": tokens, "settings": settings}, indent=1))


if __name__ == "__main__":
    main()
