"""``envace evaluate --benchmark bfcl-single``: the held-out split of the single-turn AST categories, each
item's first act step judged by bfcl-eval's ast_checker. The oracle passes every category and noop none;
a policy that writes the gold calls scores 1 and one that changes an argument 0, item by item exactly as
the official checker, called here directly on the wheel's records, judges the calls written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from envace._bfcl import bfcl_data_dir, bfcl_module
from envace.data.sources import load_source
from envace.evaluation import Policy, TaskFilter, evaluate, load_eval_policy
from envace.evaluation.bfcl_single import SPLIT_CATEGORIES
from envace.evaluation.policies import TextEngine
from envace.protocol.render import HermesFormat
from envace.rollout import Engine, Episode, SamplingConfig, stop_ids
from envace.types import ToolCall

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple"]


def _rows(result: Any) -> dict[str, tuple[float, int]]:
    return {r.category: (r.value, r.n_items) for r in result.rows if r.metric == "success"}


def test_the_oracle_passes_every_category_of_the_held_out_split_and_noop_none() -> None:
    oracle = evaluate("bfcl-single", "oracle", tasks=TaskFilter(limit=2), out=None, quiet=True)
    n = 2 * len(SPLIT_CATEGORIES)
    assert _rows(oracle) == {**{c: (1.0, 2) for c in SPLIT_CATEGORIES}, "[all]": (1.0, n)}
    train = load_source("bfcl-single-turn", split="train", categories=list(SPLIT_CATEGORIES))
    assert {it.task_id for it in oracle.items}.isdisjoint(t.id for t in train)  # the held-out split by default
    noop = evaluate("bfcl-single", "noop", tasks=TaskFilter(limit=2, categories=CATEGORIES), out=None, quiet=True)
    assert _rows(noop) == {**{c: (0.0, 2) for c in CATEGORIES}, "[all]": (0.0, 12)}


def test_an_unknown_or_unsplit_category_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="bfcl-single categories are .*got irrelevance"):
        evaluate("bfcl-single", "noop", tasks=TaskFilter(categories=["irrelevance"]), out=None, quiet=True)


@cache
def _raw_docs(category: str) -> dict[str, list[dict[str, Any]]]:
    """``id -> function docs`` read straight from the wheel's file, as bfcl-eval's runner reads them."""
    with (bfcl_data_dir() / f"BFCL_v4_{category}.json").open(encoding="utf-8") as fh:
        return {r["id"]: r["function"] for r in map(json.loads, filter(str.strip, fh))}


def official(category: str, task_id: str, answer: list[Any], calls: list[ToolCall]) -> bool:
    """bfcl-eval's ast_checker on ``calls``, with the record's own docs and possible answer."""
    checker = bfcl_module("eval_checker.ast_eval.ast_checker")
    python = bfcl_module("constants.enums").Language.PYTHON
    output = [{c.name: dict(c.arguments)} for c in calls]
    return bool(checker.ast_checker(_raw_docs(category)[task_id], output, answer, python, category, "x")["valid"])


def wrong(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls with the first argument of the first call changed (a number + 1, else the string ``zz``)."""
    first = calls[0]
    key = next(iter(first.arguments))
    value = first.arguments[key]
    changed = value + 1 if isinstance(value, int | float) and not isinstance(value, bool) else "zz"
    return [ToolCall(first.name, {**first.arguments, key: changed}), *calls[1:]]


@dataclass
class Writes(Policy):
    """A policy that writes, in one act step, its task's gold calls (``spoil``: changed by :func:`wrong`)."""

    spoil: bool = False

    def engine(self, sampling: SamplingConfig, oracle: Any = None) -> Engine:
        return TextEngine(self.tokenizer, stop_ids(self.tokenizer, self.fmt), text=self.text)

    def text(self, episode: Episode) -> str:
        calls = episode.task.gold[0]
        calls = wrong(calls) if self.spoil else calls
        return "".join(
            f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments})}</tool_call>" for c in calls
        )


def test_a_gold_call_scores_1_and_a_changed_one_0_as_the_official_checker_says() -> None:
    tokenizer = load_eval_policy("noop").tokenizer
    chosen = TaskFilter(limit=2, categories=CATEGORIES)
    by_id = {t.id: t for t in load_source("bfcl-single-turn", split="test", categories=CATEGORIES)}
    for spoil in (False, True):
        policy = Writes("writes", tokenizer, HermesFormat(tool_style="compact"), spoil=spoil)
        result = evaluate("bfcl-single", policy, tasks=chosen, out=None, quiet=True)
        assert len(result.items) == 12
        for it in result.items:
            task = by_id[it.task_id]
            written = wrong(task.gold[0]) if spoil else task.gold[0]
            verdict = official(it.category, it.task_id, task.extra["possible_answer"], written)
            assert (it.success, it.score) == (verdict, float(verdict)) == (not spoil, float(not spoil)), it.task_id
        assert _rows(result)["[all]"] == (float(not spoil), 12)
