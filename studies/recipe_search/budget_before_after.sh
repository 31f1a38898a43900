#!/usr/bin/env bash
# The test-time budget fix, before and after, on one policy and the same tasks
# (studies/recipe_search/bfcl_cpu_budget.yaml): "after" is that config on this checkout's code;
# "before" is the same config, renamed bfcl_cpu_budget_before, on a worktree of the same commit with
# only the fix's accounting reverted: Episode.budget_used counts the memory note inside
# max_episode_tokens, as the code before e98020f did. The before run's result file names the commit
# with "+dirty" (that one edited line). Then both reports (their "ended by a limit" columns).
#   studies/recipe_search/budget_before_after.sh            # runs what has no result file yet; a landed one is kept
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
envace="$root/.venv/bin/envace"
config=studies/recipe_search/bfcl_cpu_budget.yaml
after=studies/recipe_search/bfcl_cpu_budget
before=studies/recipe_search/bfcl_cpu_budget_before
unit=eval-warm_start

[[ -f "$after/units/$unit.json" ]] || "$envace" experiment --config "$config" --unit "$unit"

if [[ ! -f "$before/units/$unit.json" ]]; then
    tree="$(mktemp -d)/envace-budget-before"
    git worktree add --detach -q "$tree" HEAD
    trap 'git worktree remove --force "$tree"' EXIT
    fixed='return len(self.builder.ids) - self.note_tokens'
    grep -qF "$fixed" "$tree/src/envace/rollout/episode.py" \
        || { echo "budget_used is not the fixed line: nothing to revert" >&2; exit 1; }
    sed -i "s/$fixed/return len(self.builder.ids)/" "$tree/src/envace/rollout/episode.py"
    sed -e 's/^name: bfcl_cpu_budget$/name: bfcl_cpu_budget_before/' -e "s#^results: $after\$#results: $before#" \
        "$config" > "$tree/studies/recipe_search/bfcl_cpu_budget_before.yaml"
    (cd "$tree" && export PYTHONPATH="$tree/src" \
        && "$root/.venv/bin/python" -c 'import envace, sys; sys.exit(not envace.__file__.startswith(sys.argv[1]))' "$tree" \
        && "$envace" experiment --config studies/recipe_search/bfcl_cpu_budget_before.yaml --unit "$unit")
    rm -rf "$before"
    cp -r "$tree/$before" "$before"
fi

"$envace" experiment report "$after"
"$envace" experiment report "$before"
