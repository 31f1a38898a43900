"""Tokens forwarded per episode, counted on grounded BFCL multi-turn episodes (gold calls replayed
in the real environment, compact tools, every user turn).

Loss side: the inline layout forwards each episode once, both roles trained in that one pass. The
per-call layout forwards, for each tool call, its own row: the whole history so far, the call and
its response; the caller's trajectory is one more sequence on top (reported apart, the ratio is
taken against the per-call rows alone, the smaller count).

Rollout side: the tokens prefilled before the episode's generations (each act and each rehearsal),
the shared system turn excluded (its cache is shared either way): re-prefilling the history at
every call vs the engine's row reuse, which prefills only what was appended since the row's
previous call (and the previous call's last sampled token, never fed).
"""

from __future__ import annotations

import statistics
from typing import Any

from envace.data.grounding import ground
from envace.protocol.tokens import PieceEncoder, encode_trajectory
from envace.types import ROLE_IDS, Task


def call_row_ends(roles: list[int]) -> list[int]:
    """End (exclusive) of each rehearse span: the length of that call's per-call row.

    >>> call_row_ends([0, 1, 1, 0, 2, 2, 0, 1, 0, 2, 0])
    [6, 10]
    """
    rehearse = ROLE_IDS["rehearse"]
    return [i + 1 for i, r in enumerate(roles) if r == rehearse and (i + 1 == len(roles) or roles[i + 1] != rehearse)]


def generation_spans(roles: list[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of policy-written tokens (one per act or rehearse generation).

    >>> generation_spans([0, 1, 1, 0, 2, 2, 0, 1, 0])
    [(1, 3), (4, 6), (7, 8)]
    """
    spans, start = [], None
    for i, r in enumerate([*roles, 0]):
        if start is not None and (r == 0 or r != roles[start]):
            spans.append((start, i))
            start = None
        if start is None and r > 0:
            start = i
    return spans


def prefill_tokens(roles: list[int], prefix: int) -> tuple[int, int]:
    """Tokens prefilled before the generations of one episode past a shared ``prefix``:
    ``(re-prefilling the whole history at each call, prefilling only what is new to the row)``."""
    again = reuse = 0
    kept = prefix
    for start, end in generation_spans(roles):
        again += start - prefix
        reuse += start - kept
        kept = end - 1  # the last sampled token is fed by the next call
    return again, reuse


def episode_counts(task: Task, encode: PieceEncoder, fmt: Any, group_size: int) -> dict[str, int]:
    """Token counts of one grounded episode under each layout."""
    ep = encode_trajectory(ground(task), encode, fmt)
    ends = call_row_ends(ep.roles)
    prefix = len(encode(fmt.system(task.system_prompt, task.tools)))
    again, reuse = prefill_tokens(ep.roles, prefix)
    return {
        "prefill_re_prefill": again,
        "prefill_row_reuse": reuse,
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
        "rollout_prefill_ratio_row_reuse": round(
            sum(c["prefill_row_reuse"] for c in counts) / sum(c["prefill_re_prefill"] for c in counts), 4
        ),
    }
