"""The declared BFCL single-turn split (by called function) and its supervised targets."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from functools import cache

import pytest

from envace.data.grounding import answer_trajectory
from envace.data.sources import load_source
from envace.data.sources.bfcl_single import STRADDLES, called_functions, function_half, split_of_answer
from envace.rewards.bfcl import bfcl_single_turn
from envace.types import Task

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple"]
# Items whose possible answer breaks its own function doc: no call with the first acceptable values
# passes bfcl-eval's checker (a required parameter with no value, or a value for an undeclared one).
BROKEN_ANSWERS = {"live_multiple_862-181-3", "live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_964-207-0"}


@cache
def split(name: str) -> tuple[Task, ...]:
    return tuple(load_source("bfcl-single-turn", split=name, categories=CATEGORIES))


def _called(tasks: tuple[Task, ...]) -> set[str]:
    return {n for t in tasks for n in called_functions(t.extra["possible_answer"])}


def test_split_is_disjoint_by_called_function_and_covers_every_category() -> None:
    train, test, every = split("train"), split("test"), split("all")
    assert not _called(train) & _called(test)
    assert all(function_half(n) == "train" for n in _called(train))
    assert all(function_half(n) == "test" for n in _called(test))
    assert {t.category for t in train} == {t.category for t in test} == set(CATEGORIES)
    # the declared figures (docs/data.md): the straddling items are counted, and only parallel_multiple has any
    straddles = [t for t in every if t.extra["split"] == STRADDLES]
    assert (len(train), len(test), len(straddles), len(every)) == (1013, 1173, 125, 2311)
    assert {t.category for t in straddles} == {"parallel_multiple"}
    assert {t.id for t in train}.isdisjoint(t.id for t in test)


def test_split_of_an_answer() -> None:
    assert split_of_answer(None) is None and split_of_answer([]) is None
    assert split_of_answer([{"math.factorial": {}}, {"math.factorial": {}}]) == "train"
    assert split_of_answer([{"calc_area": {}}]) == "test"
    assert split_of_answer([{"calc_area": {}}, {"math.factorial": {}}]) == STRADDLES


_DIGEST = (
    "import hashlib, json; from envace.data.sources import load_source; "
    "print(hashlib.sha256(json.dumps([[t.id for t in load_source('bfcl-single-turn', split=s, categories={cats})] "
    "for s in ('train', 'test')]).encode()).hexdigest())"
)


def test_split_is_the_same_in_another_process() -> None:
    here = hashlib.sha256(json.dumps([[t.id for t in split(s)] for s in ("train", "test")]).encode()).hexdigest()
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # another string hash: the split must not depend on it
    code = _DIGEST.format(cats=CATEGORIES)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == here


def test_supervised_targets_pass_the_official_checker() -> None:
    verdicts: Counter[bool] = Counter()
    rejected = set()
    for task in split("train") + split("test"):
        traj = answer_trajectory(task)
        assert traj is not None and len(traj.messages) == 2  # the user turn and one act step with every call
        assert len(traj.messages[1].tool_calls) == sum(len(e) for e in task.extra["possible_answer"])
        ok = bfcl_single_turn(task, traj).success
        verdicts[ok] += 1
        if not ok:
            rejected.add(task.id)
    assert rejected <= BROKEN_ANSWERS and verdicts[True] == 1013 + 1173 - len(rejected)


def test_no_split_without_called_functions() -> None:
    with pytest.raises(ValueError, match="call no function"):
        load_source("bfcl-single-turn", split="test", categories=["simple_python", "live_irrelevance"])
    relevance = load_source("bfcl-single-turn", split="all", categories=["live_relevance"])
    assert relevance and all(t.extra["split"] is None and not t.gold for t in relevance)
