#!/usr/bin/env bash
# Run an experiment's units one at a time from a git worktree at a fixed commit, and commit each
# finished unit's result file into this checkout at once: how the CPU grids ran across sessions
# (docs/experiment.md). The code a unit runs does not move while others commit to the checkout; a
# killed driver loses at most the unit in flight, which `envace experiment` resumes from its last
# checkpoint when the driver is started again. Heavy jobs share one lock (ENVACE_LOCK), so a test
# run or a benchmark that takes it waits for the unit in flight, and the unit for it.
#
#   scripts/grid_driver.sh studies/bfcl_arms/bfcl_cpu_v2.yaml <commit> [unit ...]
#
# Without units: every unit `--list` shows as not done, in its order. The worktree is
# ../grid-<experiment name>, beside this checkout; the checkout's .venv runs it (PYTHONPATH=src).
set -euo pipefail
config=$1 commit=$2
shift 2
main=$(git rev-parse --show-toplevel)
cd "$main"
name=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$config")
results=$(python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); print(c.get('results') or 'studies/' + c['name'])" "$config")
lock=${ENVACE_LOCK:-/tmp/envace-heavy.lock}
tree="$main/../grid-$name"
limit=$((5 * 1024 * 1024))  # no file over 5 MB goes into git (tests/test_repo.py checks the tree)
small() {  # the paths of "$@" that may be committed: a file over the limit is refused in one line
  local p
  for p in "$@"; do
    if [ -f "$main/$p" ] && [ "$(stat -c %s "$main/$p")" -gt "$limit" ]; then
      echo "=== $p: $(stat -c %s "$main/$p") bytes, over 5 MB: not committed" >&2
    else
      printf '%s\n' "$p"
    fi
  done
}
[ -d "$tree" ] || git worktree add --detach "$tree" "$commit"
if [ $# -eq 0 ]; then
  mapfile -t units < <(PYTHONPATH=src .venv/bin/envace experiment --config "$config" --list | awk '$NF != "done" && $1 ~ /^[0-9]+$/ {print $2}')
else
  units=("$@")
fi
for unit in "${units[@]}"; do
  file="$results/units/$unit.json"
  [ -f "$main/$file" ] && continue
  rm -rf "${tree:?}/$results"  # first: an earlier pin's untracked results would block a pin that tracks them
  git -C "$tree" checkout -q --detach "$commit"
  git -C "$tree" checkout -q -- .  # the commit's own result files, then every one landed since
  mkdir -p "$tree/$results/units"
  cp -n "$main/$results"/units/*.json "$tree/$results/units/" 2>/dev/null || true
  if [ -d "$main/$results/checkpoints" ]; then  # the warm start's kept weights (runner.keep_policy)
    mkdir -p "$tree/$results/checkpoints"
    cp -n "$main/$results"/checkpoints/*.ckpt "$tree/$results/checkpoints/" 2>/dev/null || true
  fi
  echo "=== $(date -u +%T) $unit at $(git -C "$tree" rev-parse --short HEAD)"
  (cd "$tree" && flock "$lock" env PYTHONPATH=src "$main/.venv/bin/envace" experiment --config "$config" --unit "$unit")
  if [ -f "$tree/$file" ]; then
    mkdir -p "$main/$results/units"
    cp "$tree/$file" "$main/$file"
    cp "$tree/$results/experiment.json" "$main/$results/" 2>/dev/null || true
    paths=("$file" "$results/experiment.json")
    for kept in "$tree/$results"/checkpoints/*.ckpt; do  # committed with the result that made it
      [ -f "$kept" ] && [ ! -f "$main/$results/checkpoints/${kept##*/}" ] || continue
      mkdir -p "$main/$results/checkpoints" && cp "$kept" "$main/$results/checkpoints/"
      # here for the next unit's tree; committed only where git takes it (.gitignore keeps weights out,
      # and one ignored path would make every `git add` below fail, the result file's with it)
      git check-ignore -q "$results/checkpoints/${kept##*/}" || paths+=("$results/checkpoints/${kept##*/}")
    done
    record="$results/policies/$unit.json"  # a released policy's record (its weights stay in the cache's store)
    if [ -f "$tree/$record" ]; then  # committed with the result file
      mkdir -p "$main/$results/policies" && cp "$tree/$record" "$main/$record"
      paths+=("$record")
    fi
    mapfile -t paths < <(small "${paths[@]}")
    for _ in 1 2 3 4 5; do  # another commit may hold the index for a moment
      git add "${paths[@]}" && git commit -qm "$name: $unit" -- "${paths[@]}" && break
      sleep 5
    done
    # a grid whose commit predates release_seeds: this checkout's code releases the fit's policy
    # while its checkpoint is here (a unit outside release_seeds is said so in one line)
    if [[ $unit != eval-* ]] && [ ! -f "$main/$record" ]; then
      PYTHONPATH=src .venv/bin/envace experiment --config "$config" --release --unit "$unit" 2>&1 | tail -1 || true
      if [ -f "$main/$record" ] && [ -n "$(small "$record")" ]; then
        git add "$record" && git commit -qm "$name: $unit released" -- "$record" || true
      fi
    fi
  fi
done
echo "=== $(date -u +%T) $name: no unit left in this list"
