#!/usr/bin/env bash
# The GPU check rehearsed on CPU (scripts/gpu_check.sh --small), as the GPU machine would run it: a
# venv holding only the image's packages at its versions (scripts/gpu_image.txt: Python 3.12, torch
# 2.11.0 from PyPI, transformers 5.17.0, lightning 2.6.6, ...; nothing else a fit imports), and a
# fresh folder holding only what a device call carries (the files git tracks or would add, less
# what scripts/gpu_aside.sh sets aside, and build/gpu's wheels and tokenizer). A missing wheel, or a
# version the project cannot run on, fails here. About 4 GB and a few minutes for the venv (once),
# then ~2-4 minutes on two cores.
#   bash scripts/gpu_rehearsal.sh            # VENV=/tmp/gpu-rehearsal-venv PY312=python3.12
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/tmp/gpu-rehearsal-venv}
PY312=${PY312:-}
for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
  [ -n "$PY312" ] && break
  "$candidate" -c '' 2>/dev/null && PY312=$candidate  # a pyenv shim of another version fails here
done
[ -n "$PY312" ] || { echo "gpu_rehearsal: no Python 3.12 (the image's); set PY312" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  "$PY312" -m venv "$VENV"
  # the image's pinned versions, and its unpinned packages a fit or their installs touch
  "$VENV/bin/pip" install -q $(grep -E '^[a-z0-9-]+==' scripts/gpu_image.txt) \
    peft tensorboard pyyaml pandas matplotlib filelock mpmath tqdm requests httpx jinja2 psutil regex packaging
  # what pip pulled in that the image does not hold (e.g. pydantic through a newer typer) goes again
  extra=$("$VENV/bin/pip" list --format=freeze | sed 's/==.*//' | tr 'A-Z_.' 'a-z--' |
    grep -vxF -f <(grep -v '^#' scripts/gpu_image.txt | sed 's/==.*//') | grep -vx -e pip -e tzdata || true)
  [ -z "$extra" ] || "$VENV/bin/pip" uninstall -q -y $extra
fi
make -s gpu-wheels VENV="${ENVACE_VENV:-.venv}"
work=$(mktemp -d /tmp/gpu-rehearsal-XXXX)
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
  if [ -f "$f" ] && { [ "${f#docs/experiments/}" = "$f" ] || [ "$(stat -c %s "$f")" -le 1048576 ]; }; then printf '%s\0' "$f"; fi
done | xargs -0 cp --parents -t "$work"
mkdir -p "$work/build/gpu" && cp -r build/gpu/wheels build/gpu/tokenizer "$work/build/gpu/"
echo "gpu_rehearsal: $(du -sh "$work" | cut -f1) in $work (what a call carries); $("$VENV/bin/python" -c 'import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)')" >&2
began=$(date +%s)
(cd "$work" && PYTHON="$VENV/bin/python" bash scripts/gpu_check.sh --small --out "$work/gpu_check.json")
"$VENV/bin/python" -c "import json, sys; r = json.load(open(sys.argv[1])); assert set(r['models']) == {'qwen3-0.6b', 'smollm2-135m'}" "$work/gpu_check.json"
echo "gpu_rehearsal: passed in $(( $(date +%s) - began )) s; JSON in $work/gpu_check.json" >&2
