#!/usr/bin/env bash
# The GPU check on the lent GPU machine as it is (no package registry there): the image's python3 and
# packages, the project from the working tree (PYTHONPATH=src, no install), and the wheels and
# tokenizer of `make gpu-wheels` (build/gpu, carried with the call) installed offline into
# build/gpu/site. Prints one JSON object (scripts/gpu_check.py), bounded to 8 minutes; fails in one
# line on a machine without a GPU. docs/performance.md says how to call it within the 64 MiB a call carries.
#   bash scripts/gpu_check.sh [--out gpu_check.json] [--models qwen3-0.6b,smollm2-135m]
#   bash scripts/gpu_check.sh --small      # the CPU rehearsal (scripts/gpu_rehearsal.sh)
# PYTHON picks another interpreter (the rehearsal's venv); GPU_CHECK_TIMEOUT the bound in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
case " $* " in
  *" --small "*) ;;
  *) nvidia-smi -L >/dev/null 2>&1 || { echo "gpu_check: no GPU here (nvidia-smi finds none); --small rehearses on CPU" >&2; exit 2; } ;;
esac
ls build/gpu/wheels/*.whl >/dev/null 2>&1 && [ -f build/gpu/tokenizer/tokenizer.json ] ||
  { echo "gpu_check: build/gpu has no wheels or tokenizer: run \`make gpu-wheels\` where PyPI is reachable and carry build/gpu" >&2; exit 2; }
rm -rf build/gpu/site
"$PYTHON" -m pip install -q --no-index --no-deps --disable-pip-version-check --target build/gpu/site build/gpu/wheels/*.whl
export PYTHONPATH="$PWD/src:$PWD/build/gpu/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec timeout "${GPU_CHECK_TIMEOUT:-480}" "$PYTHON" scripts/gpu_check.py "$@"
