#!/usr/bin/env bash
# The vLLM issue's fit comparison over seeds (docs/vllm.md, "A fit on each engine"): for each seed,
# `envace fit --config configs/bfcl.yaml` on our engine and on vLLM, one at a time under the heavy-job
# lock (ENVACE_LOCK), from a git worktree at a fixed commit, each fit timed by /usr/bin/time -v; each
# fit's summary (curves, wall time, peak memory: studies/engine_fits/compare_fits.py --save) is committed into
# studies/engine_fits/results/ as it lands. A fit whose summary exists is skipped; one killed half
# way starts again from step 0 (a resumed fit would restart its task order: docs/training.md).
#
#   studies/engine_fits/engine_fits.sh <commit> <seed> [seed ...]
#   .venv/bin/python studies/engine_fits/compare_fits.py --a studies/engine_fits/results/ours-s*.json \
#                                            --b studies/engine_fits/results/vllm-s*.json
set -euo pipefail
commit=$1
shift
main=$(git rev-parse --show-toplevel)
cd "$main"
lock=${ENVACE_LOCK:-/tmp/envace-heavy.lock}
results=studies/engine_fits/results
tree="$main/../engine-fits"
[ -d "$tree" ] || git worktree add --detach "$tree" "$commit"
git -C "$tree" checkout -q --detach "$commit"
mkdir -p "$results" "$tree/runs"
for seed in "$@"; do
  for engine in ours vllm; do
    file="$results/$engine-s$seed.json"
    [ -f "$file" ] && continue
    version="engine_${engine}_s$seed"
    rm -rf "$tree/runs/bfcl/$version"
    args=(--config configs/bfcl.yaml --seed_everything "$seed" --trainer.logger.init_args.version "$version")
    [ "$engine" = vllm ] && args+=(--model.sampling.engine vllm --model.sampling.vllm.venv "$main/.venv-vllm")
    echo "=== $(date -u +%T) $version at $(git -C "$tree" rev-parse --short HEAD)"
    (cd "$tree" && flock "$lock" /usr/bin/time -v -o "runs/$version.time" \
      env PYTHONPATH=src "$main/.venv/bin/envace" fit "${args[@]}" > "runs/$version.log" 2>&1)
    "$main/.venv/bin/python" studies/engine_fits/compare_fits.py --save "$tree/runs/bfcl/$version" "$file" \
      --time-log "$tree/runs/$version.time" --commit "$(git -C "$tree" rev-parse HEAD)"
    for _ in 1 2 3 4 5; do  # another commit may hold the index for a moment
      git add "$file" && git commit -qm "engine_fits: $engine seed $seed (commit $commit)" -- "$file" && break
      sleep 5
    done
  done
done
echo "=== $(date -u +%T) engine_fits: done"
