"""Loss-side tokens: one sequence per episode (inline rehearsal) vs one prompt per call (upstream).

Counted on grounded BFCL multi-turn episodes (gold calls replayed in the real environment, compact
tools, every user turn). The inline layout forwards each episode once, both roles trained in that
one pass. The per-call layout forwards, for each tool call, its own row: the whole history so far,
the call and its response; the caller's trajectory is one more sequence on top (reported apart, the
ratio is taken against the per-call rows alone, the smaller count).
"""

from __future__ import annotations

import statistics
from typing import Any

from envace.data.grounding import ground
from envace.protocol.episode import PieceEncoder, encode_trajectory
from envace.types import ROLE_IDS, Task


def call_row_ends(roles: list[int]) -> list[int]:
    """End (exclusive) of each rehearse span: the length of that call's per-call row.

    >>> call_row_ends([0, 1, 1, 0, 2, 2, 0, 1, 0, 2, 0])
    [6, 10]
    """
    rehearse = ROLE_IDS["rehearse"]
    return [i + 1 for i, r in enumerate(roles) if r == rehearse and (i + 1 == len(roles) or roles[i + 1] != rehearse)]


def episode_counts(task: Task, encode: PieceEncoder, fmt: Any, group_size: int) -> dict[str, int]:
    """Token counts of one grounded episode under each layout."""
    ep = encode_trajectory(ground(task), encode, fmt)
    ends = call_row_ends(ep.roles)
    prefix = len(encode(fmt.system(task.system_prompt, task.tools)))
    return {
        "inline": len(ep.ids),
        "inline_shared_prefix": (prefix + group_size * (len(ep.ids) - prefix)) // group_size,
        "per_call": sum(ends),
        "per_call_with_caller": sum(ends) + len(ep.ids),
        "calls": len(ends),
    }


def bench_layout(module: Any, tasks: list[Task], group_size: int = 4) -> dict[str, Any]:
    """Mean tokens forwarded per episode under each layout, and their ratios."""
    encode = PieceEncoder(module.tokenizer)
    counts = [episode_counts(t, encode, module.fmt, group_size) for t in tasks if t.gold]
    counts = [c for c in counts if c["calls"]]
    mean = {k: round(statistics.mean(c[k] for c in counts), 1) for k in counts[0]}
    ratios = [c["inline"] / c["per_call"] for c in counts]
    return {
        "episodes": len(counts),
        "mean_tokens_per_episode": mean,
        "ratio_inline_to_per_call": round(sum(c["inline"] for c in counts) / sum(c["per_call"] for c in counts), 4),
        "ratio_per_episode": {
            "min": round(min(ratios), 4),
            "median": round(statistics.median(ratios), 4),
            "max": round(max(ratios), 4),
        },  # fmt: skip
        "ratio_with_shared_prefix": round(
            sum(c["inline_shared_prefix"] for c in counts) / sum(c["per_call"] for c in counts), 4
        ),
        "group_size_for_shared_prefix": group_size,
    }
