"""A few RL steps of a Qwen3-0.6B-shaped policy with rollouts on vLLM, on one GPU: the GPU path checked.

    python scripts/gpu_check.py [--steps 3] [--out runs/gpu_check]     (scripts/gpu_check.sh runs it)

No hub: the model is built from Qwen3-0.6B's published hyperparameters (28 layers, hidden 1024, 16
query and 8 key-value heads of 128, MLP 3072, RoPE theta 1e6, tied embeddings) with random weights,
over the packaged SmolLM2 tokenizer (49,152 ids instead of Qwen's 151,936: every layer's cost is
Qwen3-0.6B's, the embedding is smaller), saved once to ``$ENVACE_CACHE/models/qwen3-0.6b-random``; a
folder of real weights can be given with ``--model``. Then ``envace fit`` on configs/bfcl.yaml: no
warm start, ``--steps`` RL steps of 4 tasks x G = 4 with LoRA, bf16, ``sampling.engine vllm``.
Prints the rollouts' generated tokens/s (``train/rollout/tokens_per_s`` of each step), the trainer's
peak CUDA memory and the GPU's peak used memory (trainer and vLLM server together, sampled by
nvidia-smi), and the wall time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

#: Qwen3-0.6B's config.json, as published (the vocabulary is the tokenizer's here)
QWEN3_0_6B = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_act="silu", attention_bias=False, attention_dropout=0.0,
)  # fmt: skip


def random_qwen3(folder: Path) -> Path:
    """The Qwen3-0.6B-shaped random model and the packaged tokenizer, saved once to ``folder``."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from envace.policy import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    config = Qwen3Config(vocab_size=len(tokenizer), **ids, **QWEN3_0_6B)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class GpuMemory(threading.Thread):
    """The GPU's used memory (every process on it), sampled by nvidia-smi every second; ``peak_mib``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib, self.running = 0, True

    def run(self) -> None:
        while self.running:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10)  # fmt: skip
            if out.returncode == 0 and out.stdout.strip():
                self.peak_mib = max(self.peak_mib, int(out.stdout.split()[0]))
            time.sleep(1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", default=None, help="a folder of real weights (default: the random Qwen3-0.6B)")
    parser.add_argument("--out", default="runs/gpu_check")
    args = parser.parse_args()
    import torch

    from envace.cli import lightning_cli
    from envace.paths import cache_dir

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 2
    model = args.model or str(random_qwen3(cache_dir() / "models" / "qwen3-0.6b-random"))
    monitor = GpuMemory()
    monitor.start()
    began = time.perf_counter()
    lightning_cli([
        "fit", "--config", "configs/bfcl.yaml",
        "--model.init_args.policy.name_or_path", model,
        "--model.init_args.warm_start_steps", "0", "--model.init_args.optim.lr", "1e-5",
        "--model.init_args.sampling.engine", "vllm", "--model.init_args.sampling.vllm.dtype", "bfloat16",
        "--model.init_args.sampling.vllm.gpu_memory_utilization", "0.3",
        "--data.tasks_per_step", "4", "--data.max_prompt_tokens", "1300",
        "--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "bf16-mixed",
        "--trainer.max_steps", str(args.steps), "--trainer.limit_val_batches", "0",
        "--trainer.num_sanity_val_steps", "0",
        "--trainer.logger.init_args.save_dir", args.out, "--trainer.logger.init_args.version", "vllm",
    ])  # fmt: skip
    wall = time.perf_counter() - began
    monitor.running = False
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(args.out) / "bfcl" / "vllm"))
    events.Reload()
    rates = [round(e.value, 1) for e in events.Scalars("train/rollout/tokens_per_s")]
    print(
        f"gpu_check: {args.steps} RL steps in {wall:.0f} s (vLLM start-up included) on {torch.cuda.get_device_name()}"
    )
    print(f"gpu_check: rollout tokens/s per step {rates}")
    print(f"gpu_check: trainer peak CUDA memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB; "
          f"GPU peak used (trainer + vLLM) {monitor.peak_mib / 1024:.1f} GiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
