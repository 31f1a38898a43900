#!/usr/bin/env bash
# The GPU path in one go, for the first session lent a GPU: .venv (make install) and .venv-vllm with
# the `vllm` CUDA package (make vllm: needs PyPI from that machine), then a few RL steps of a
# Qwen3-0.6B-shaped policy with rollouts on vLLM (scripts/gpu_check.py), bounded to 8 minutes,
# printing rollout tokens/s and peak memory.
#   bash scripts/gpu_check.sh [--steps 3] [--model /folder/of/real/weights]
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L || { echo "gpu_check: no GPU (nvidia-smi)" >&2; exit 2; }
make install
make vllm
export PYTHONUNBUFFERED=1
exec timeout 480 .venv/bin/python scripts/gpu_check.py "$@"
