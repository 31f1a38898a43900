"""The report's section by stratum, for a grid whose task ids name their stratum (ShopWorld's
``shopworld-test-0004-S5_control``, docs/shopworld.md): each policy's success on each stratum, and
each arm − warm start on each with its paired interval and every seed's own difference (the runs as
units). A control stratum (a predicted null) is then read apart from the others, as a study's rules
ask, without a hypothesis of its own. A grid whose task ids name no stratum has no such section.
"""

from __future__ import annotations

import fnmatch

from envace.data.sources.shopworld import STRATA as KNOWN_STRATA  # the strata a task id can name, as -<stratum>
from envace.experiment.hypotheses import Boot, format_interval, markdown_table
from envace.experiment.judge import Comparison, diff, seed_differences
from envace.experiment.results import WARM, Results, item_values


def stratum_of(task_id: str) -> str | None:
    """The stratum a task id names, or ``None``.

    >>> stratum_of("shopworld-test-0004-S5_control"), stratum_of("shopworld-test-0000-S1_copy-heldout")
    ('S5_control', 'S1_copy')
    >>> stratum_of("multi_turn_base_12") is None
    True
    """
    parts = task_id.split("-")
    return next((s for s in KNOWN_STRATA if s in parts), None)


def named_strata(results: Results) -> list[str]:
    """The strata the grid's evaluated tasks name, in :data:`KNOWN_STRATA`'s order."""
    named = {stratum_of(it.task_id) for e in results.evals for it in e.items}
    return [s for s in KNOWN_STRATA if s in named]


def _pattern(stratum: str) -> str:
    """The task ids of a stratum, as a hypothesis's ``where: {task: ...}`` selects them."""
    return f"*-{stratum}*"


def _policy_cell(results: Results, boot: Boot, arm: str, stratum: str) -> str:
    values = item_values(results, arm, "success", results.experiment.splits)
    mine = {k: v for k, v in values.items() if fnmatch.fnmatchcase(k.partition("/")[2], _pattern(stratum))}
    return format_interval(boot.mean(mine))


def _diff_cell(results: Results, boot: Boot, arm: str, stratum: str) -> str:
    c = Comparison(a=arm, b=WARM, where={"task": _pattern(stratum)})
    d, seeds = diff(results, c, boot), seed_differences(results, c)
    by_seed = ", ".join(f"s{seed} {value:+.2f}" for seed, value in seeds)
    return format_interval(d) + (f" ({by_seed})" if by_seed else "")


def strata_section(results: Results, boot: Boot) -> list[str]:
    """``## By stratum``: success per policy and stratum, and each arm − warm start per stratum (all
    splits the grid evaluated pooled; no rehearsal). Empty when no task id names a stratum."""
    strata = named_strata(results)
    if not strata:
        return []
    arms = [arm for arm in results.experiment.arms if any(e.arm == arm for e in results.evals)]
    policies = [("warm start", WARM), *((arm, arm) for arm in arms)]
    success_rows = [[label, *(_policy_cell(results, boot, arm, s) for s in strata)] for label, arm in policies]
    diff_rows = [[arm, *(_diff_cell(results, boot, arm, s) for s in strata)] for arm in arms]
    return [
        "## By stratum",
        "",
        "The task ids name their stratum: success per stratum with no rehearsal (`mean [lo, hi]`, intervals as "
        "in Results), then `arm − warm start` per stratum, paired by task, with each seed's own difference "
        "(that seed's mean over the stratum's tasks − the warm start's): the runs as units. A stratum has "
        "fewer tasks than the pool, so its minimum detectable difference is larger.",
        "",
        *markdown_table(["policy", *strata], success_rows),
        "",
        *markdown_table(["arm − warm start", *strata], diff_rows),
        "",
    ]
