#!/usr/bin/env bash
# The test-time budget fix, before and after, on one policy and the same tasks
# (configs/experiments/bfcl_cpu_budget.yaml): "after" is that config on this checkout's code;
# "before" is the same config, renamed bfcl_cpu_budget_before, on a worktree of the same commit with
# only the fix's accounting reverted: Episode.budget_used counts the memory note inside
# max_episode_tokens, as the code before e98020f did. The before run's result file names the commit
# with "+dirty" (that one edited line). Both reports: envace experiment report docs/experiments/bfcl_cpu_budget{,_before}
#   scripts/budget_before_after.sh            # run what is not done of both (resumable: done units are kept)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
envace="$root/.venv/bin/envace"
config=configs/experiments/bfcl_cpu_budget.yaml

"$envace" experiment --config "$config" --unit eval-warm_start
"$envace" experiment report docs/experiments/bfcl_cpu_budget

tree="$(mktemp -d)/envace-budget-before"
git worktree add --detach -q "$tree" HEAD
trap 'git worktree remove --force "$tree"' EXIT
fixed='return len(self.builder.ids) - self.note_tokens'
grep -qF "$fixed" "$tree/src/envace/rollout/episode.py" || { echo "budget_used is not the fixed line: nothing to revert" >&2; exit 1; }
sed -i "s/$fixed/return len(self.builder.ids)/" "$tree/src/envace/rollout/episode.py"
sed -e 's/^name: bfcl_cpu_budget$/name: bfcl_cpu_budget_before/' \
    -e 's#^results: docs/experiments/bfcl_cpu_budget$#results: docs/experiments/bfcl_cpu_budget_before#' \
    "$config" > "$tree/configs/experiments/bfcl_cpu_budget_before.yaml"
mkdir -p docs/experiments/bfcl_cpu_budget_before
rm -rf "$tree/docs/experiments/bfcl_cpu_budget_before"
cp -r docs/experiments/bfcl_cpu_budget_before "$tree/docs/experiments/"   # its units done so far
(cd "$tree" && export PYTHONPATH="$tree/src" \
    && "$root/.venv/bin/python" -c 'import envace, sys; sys.exit(not envace.__file__.startswith(sys.argv[1]))' "$tree" \
    && "$envace" experiment --config configs/experiments/bfcl_cpu_budget_before.yaml --unit eval-warm_start \
    && "$envace" experiment report docs/experiments/bfcl_cpu_budget_before)
rm -rf docs/experiments/bfcl_cpu_budget_before
cp -r "$tree/docs/experiments/bfcl_cpu_budget_before" docs/experiments/
