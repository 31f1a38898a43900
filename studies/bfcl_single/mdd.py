"""The minimum detectable difference (MDD) of issue #51's comparison, stated before any result (rules.md).

An arm's held-out pass rate pools its k seeds' runs over the n held-out items; the warm start is
evaluated once (greedy: one evaluation is all of it). Two-sided alpha 0.05, power 0.8: z = 1.960 + 0.842.

* unpaired: the two pass rates as independent proportions at pass rate p: the arm from k·n item-runs,
  the warm start from n, so SE = sqrt(p(1-p)/(k n) + p(1-p)/n); the issue's 0.036 takes k·n on both
  sides, which a single greedy warm start does not have.
* paired: the same items on both sides; each item's difference averaged over the seeds. With a share q
  of items that one seed's run moves (passes where the warm start fails or the other way), the
  per-item difference has variance at most q/k when the seeds move items independently, so
  SE = sqrt(q / (k n)). q is unknown before the runs: the table gives q = 0.1, 0.2, 0.3.

    python studies/bfcl_single/mdd.py        # the table rules.md quotes (n from the declared test split)
"""

from __future__ import annotations

import math

Z = 1.959964 + 0.841621  # two-sided alpha 0.05, power 0.8
CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple"]


def mdd_unpaired(n: int, k: int, p: float) -> float:
    """MDD of (arm over k seeds) - (warm start once) as independent proportions at pass rate ``p``.

    >>> round(mdd_unpaired(1000, 3, 0.5), 4)
    0.0511
    """
    return Z * math.sqrt(p * (1 - p) / (k * n) + p * (1 - p) / n)


def mdd_paired(n: int, k: int, q: float) -> float:
    """MDD of the mean per-item paired difference when a share ``q`` of items moves per seed.

    >>> round(mdd_paired(1000, 3, 0.2), 4)
    0.0229
    """
    return Z * math.sqrt(q / (k * n))


def table(n: int, k: int = 3) -> str:
    """The markdown table rules.md quotes."""
    rows = [f"| unpaired, p = {p} | {mdd_unpaired(n, k, p):.3f} |" for p in (0.1, 0.3, 0.5)]
    rows += [f"| paired, q = {q} | {mdd_paired(n, k, q):.3f} |" for q in (0.1, 0.2, 0.3)]
    return "\n".join([f"n = {n} held-out items, k = {k} seeds", "", "| test | MDD |", "|---|---|", *rows])


if __name__ == "__main__":
    from envace.data.sources import load_source

    print(table(len(load_source("bfcl-single-turn", split="test", categories=CATEGORIES))))
