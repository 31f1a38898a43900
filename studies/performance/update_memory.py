"""Where the memory of an update goes: peak resident memory of one RL-shaped update of the packaged
model (``configs/bfcl.yaml``'s LoRA), by ``loss_chunk_tokens`` and precision, each setting in a
fresh process (peak RSS only grows within a process).

The batch is what an RL step of ``make fit`` updates on: 2 tasks x G = 4 episodes of about 1,400
tokens (grounded BFCL episodes; the members of a group share their system turn). Prints one JSON
object: per setting the resident memory before the update, its peak, and the seconds of the update.

    .venv/bin/python studies/performance/update_memory.py  # fp32 and bf16, chunks off/1024/2048/4096
    .venv/bin/python studies/performance/update_memory.py --dtypes fp32 --chunks 0,2048
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from contextlib import nullcontext

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


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def _current_gb() -> float:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1e6


def one(chunk: int, dtype: str, tokens: int, groups: int, group_size: int) -> dict[str, float]:
    """One update in this process; returns its memory figures."""
    from envace.bench.common import bfcl_tasks

    torch.set_num_threads(2)
    module = EnvACEModule(policy=PolicySpec("smollm2-135m", lora=LORA), tool_style="compact",
                          loss_chunk_tokens=chunk or None)  # fmt: skip
    module.configure_model()
    encode = PieceEncoder(module.tokenizer)
    episodes = []
    for task in [t for t in bfcl_tasks() if t.gold][:groups]:
        ep = encode_trajectory(ground(task), encode, module.fmt)
        episodes += [ep.tensors() for _ in range(group_size)]
    batch = collate_episodes(episodes, module.tokenizer.pad_token_id)
    batch = batch._replace(**{k: getattr(batch, k)[:, :tokens] for k in batch._fields})
    rows = batch.input_ids.shape[0]
    inputs = LossInputs(batch.logprobs, batch.logprobs, batch.roles, batch.loss_mask,
                        torch.arange(rows, dtype=torch.float32) % 2, torch.arange(rows) // group_size)  # fmt: skip
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
    before = _current_gb()
    began = time.perf_counter()
    with cast:
        backward_in_chunks(module._logprobs, batch, lambda lp: module.loss(inputs._replace(logprobs=lp)), chunk or None,
                           prefix_of=module._prefix)  # fmt: skip
    return {"rows": rows, "tokens": int(batch.attention_mask.sum()), "resident_before_gb": round(before, 2),
            "peak_gb": round(_rss_gb(), 2), "seconds": round(time.perf_counter() - began, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", default="0,1024,2048,4096", help="loss_chunk_tokens values (0: one forward)")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--tokens", type=int, default=1400, help="most tokens per episode")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # chunk:dtype, run in this process
    args = parser.parse_args()
    if args.one:
        chunk, dtype = args.one.split(":")
        print(json.dumps(one(int(chunk), dtype, args.tokens, args.groups, args.group_size)))
        return
    out = {}
    for dtype in args.dtypes.split(","):
        for chunk in args.chunks.split(","):
            cmd = [sys.executable, __file__, "--one", f"{chunk}:{dtype}", "--tokens", str(args.tokens),
                   "--groups", str(args.groups), "--group-size", str(args.group_size)]  # fmt: skip
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
            result = (
                json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {"error": run.stderr[-500:]}
            )
            out[f"{dtype} chunk={chunk}"] = result
            print(f"{dtype} chunk={chunk}: {result}", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
