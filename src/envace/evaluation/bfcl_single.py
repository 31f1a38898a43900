"""BFCL single-turn AST items on their declared split (``envace evaluate --benchmark bfcl-single``).

The items of the AST categories that have a possible answer, on the split by called function of
:mod:`envace.data.sources.bfcl_single` (default ``test``: no item calls a function a ``train`` item
calls). Each item is scored as :class:`~envace.evaluation.bfcl.BFCLBenchmark` scores it: the policy's
first act step is its answer (one step, as BFCL's FC mode), judged by bfcl-eval's ``ast_checker``,
success 1 or 0. The rows are the success per category and pooled over every item (``[all]``, each
item weighing the same), not BFCL's Overall: the split leaves out part of every category.
"""

from __future__ import annotations

from envace.data.sources import load_source
from envace.data.sources.bfcl import SINGLE_TURN_CATEGORIES
from envace.evaluation.base import ItemResult, Summary, by_category, mean
from envace.evaluation.bfcl import BFCLBenchmark
from envace.types import Task

#: the single-turn categories with a possible answer: those the split by called function divides
SPLIT_CATEGORIES = tuple(c for c in SINGLE_TURN_CATEGORIES if not c.endswith("relevance"))


class BFCLSingleBenchmark(BFCLBenchmark):
    """BFCL single-turn AST items of one declared split (``tasks.split``: ``test``, the default, or
    ``train``; ``tasks.categories``: default :data:`SPLIT_CATEGORIES`)."""

    name = "bfcl-single"
    headline = "success"

    def tasks(self) -> list[Task]:
        cats = list(self.filter.categories or SPLIT_CATEGORIES)
        unknown = [c for c in cats if c not in SPLIT_CATEGORIES]
        if unknown:
            raise ValueError(f"bfcl-single categories are {', '.join(SPLIT_CATEGORIES)}; got {', '.join(unknown)}")
        split = self.filter.split or "test"
        return self.filter.apply(load_source("bfcl-single-turn", split=split, path=self.filter.path, categories=cats))

    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        groups = {**by_category(items), "[all]": items}
        return [
            Summary(cat, "success", mean([float(it.success) for it in group]), group)
            for cat, group in groups.items()
            if group
        ]

    def notes(self) -> list[str]:
        split = self.filter.split or "test"
        return [
            f"success: bfcl-eval's ast_checker accepts the first act step's calls; split {split!r} by called "
            "function (envace.data.sources.bfcl_single); [all] pools the items, not BFCL's Overall"
        ]
