#!/usr/bin/env bash
# Set the committed weight files aside before a GPU machine call, and back after. A call carries the
# working tree and its carried paths, 64 MiB in all; git tracks ~160 MiB, most of it the studies'
# checkpoints, adapters and tokenizers under docs/experiments/ (no GPU check reads them).
#   bash scripts/gpu_aside.sh out    # removes every tracked file over 1 MiB under docs/experiments/ from the work tree
#   bash scripts/gpu_aside.sh back   # restores them from git (git checkout), byte for byte
# Nothing is committed or copied: between the two, `git status` shows them deleted; commit nothing then.
set -euo pipefail
cd "$(dirname "$0")/.."
list=build/gpu/aside.txt
case "${1:-}" in
  out)
    mkdir -p build/gpu
    git ls-files -z docs/experiments | xargs -0 -r stat -c '%s %n' | awk '$1 > 1048576 { sub(/^[0-9]+ /, ""); print }' > "$list"
    xargs -r -d '\n' rm -f < "$list"
    carried=$( (git ls-files -z -co --exclude-standard | xargs -0 -r stat -c '%s' 2>/dev/null || true) |
      awk '{ s += $1 } END { printf "%.1f", s / 1048576 }')  # the files set aside are still listed: stat skips them
    echo "gpu_aside: $(wc -l < "$list") files set aside; the work tree a call carries is now ${carried} MiB (+ build/gpu)" ;;
  back)
    [ -s "$list" ] || { echo "gpu_aside: nothing set aside ($list)" >&2; exit 0; }
    xargs -r -d '\n' git checkout -- < "$list"
    echo "gpu_aside: $(wc -l < "$list") files restored from git"
    rm -f "$list" ;;
  *) echo "usage: bash scripts/gpu_aside.sh out|back" >&2; exit 2 ;;
esac
