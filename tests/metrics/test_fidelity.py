"""Rehearsal fidelity: the pair scores on hand-worked examples, the torchmetrics accumulation,
the per-benchmark/per-tool breakdown, and the sum-reduction across two processes."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from envace.metrics import (
    FidelityMetrics,
    FidelityTracker,
    decision_f1,
    error_agreement,
    exact_match,
    json_valid,
    key_paths,
    key_set_f1,
    leaf_value_f1,
    score_pair,
)
from envace.protocol import parse_rehearsal
from envace.rollout import FidelityPair
from envace.types import ToolCall, error_observation

NO_TAG = parse_rehearsal("just text")


def pair(name: str, rehearsed, real, benchmark: str = "bfcl") -> FidelityPair:
    return FidelityPair(ToolCall(name, {}), rehearsed, real, benchmark)


def test_json_valid_only_rejects_the_rehearsal_parse_errors() -> None:
    for text in ["", "x", "<execution_result>{}</execution_result>", "<execution_result>{1</execution_result>",
                 "<execution_result>{</execution_result><execution_result>"]:  # fmt: skip
        assert not json_valid(parse_rehearsal(text)), text
    assert json_valid(error_observation("EXECUTION_ERROR", "cd: no such folder"))  # a rehearsed failure
    assert json_valid({"error": "no such file"}) and json_valid([1]) and json_valid({"a": None})


def test_key_paths_and_f1_by_hand() -> None:
    rehearsed = {"files": [{"name": "a", "size": 1}], "cwd": "/w"}
    real = {"files": [{"name": "a"}, {"name": "b", "mode": "r"}], "count": 2}
    assert key_paths(rehearsed) == {"files", "files[].name", "files[].size", "cwd"}
    assert key_paths(real) == {"files", "files[].name", "files[].mode", "count"}
    # shared {files, files[].name}: F1 = 2*2 / (4 + 4) = 0.5
    assert key_set_f1(rehearsed, real) == 0.5
    # leaves: rehearsed {(files[].name,"a"), (files[].size,1), (cwd,"/w")};
    #         real {(files[].name,"a"), (files[].name,"b"), (files[].mode,"r"), (count,2)}: one shared
    assert leaf_value_f1(rehearsed, real) == pytest.approx(2 * 1 / (3 + 4))
    # multiset: a repeated leaf counts once per occurrence: 2*1 / (2 + 1)
    assert leaf_value_f1({"x": [7, 7]}, {"x": [7]}) == pytest.approx(2 / 3)
    assert leaf_value_f1({"x": [1, 2]}, {"x": [2, 1]}) == 1.0 and not exact_match({"x": [1, 2]}, {"x": [2, 1]})


def test_edge_cases() -> None:
    assert key_set_f1([1, 2], ["a"]) == 1.0  # no keys on either side
    assert key_set_f1({}, {"a": 1}) == 0.0 and key_set_f1({"a": 1}, []) == 0.0
    assert leaf_value_f1({}, {}) == 1.0 and leaf_value_f1({}, []) == 0.0  # "{}" vs "[]" leaves differ
    assert exact_match({"n": 1.0, "m": [True]}, {"m": [True], "n": 1}) and not exact_match({"b": True}, {"b": 1})


def test_error_agreement() -> None:
    assert error_agreement({"error": "x"}, error_observation("EXECUTION_ERROR", "y"))
    assert error_agreement({"ok": 1}, [1]) and not error_agreement([1], {"error": "no"})
    # an invalid rehearsal agrees with nothing, not even a real error
    assert score_pair(NO_TAG, {"error": "boom"}).error_agreement == 0.0
    assert tuple(score_pair({"error": "boom"}, {"error": "bang"})) == (1.0, 0.0, 1.0, 0.0, 1.0, 0.0)


def test_decision_f1_scores_the_facts_a_next_call_uses_and_only_those() -> None:
    real = {"results": [{"sku": "K7Q2", "name": "red classic mug", "price": 4.5, "in_stock": True}]}
    prose = {"results": [{"sku": "K7Q2", "name": "a red mug", "price": 4.5, "in_stock": True}]}
    assert decision_f1(prose, real) == 1.0 and leaf_value_f1(prose, real) < 1.0  # the name is not a decision
    wrong_sku = {"results": [{"sku": "K7Q3", "name": "red classic mug", "price": 4.5, "in_stock": True}]}
    assert decision_f1(wrong_sku, real) == pytest.approx(2 / 3) and leaf_value_f1(wrong_sku, real) == 0.75
    assert decision_f1({"order_id": "A1001", "total": 9.0}, {"order_id": "A1002", "total": 9.0}) == 0.0
    assert decision_f1({"files": ["a"]}, {"files": ["b"]}) == 1.0  # no decision field on either side


def test_metric_means_by_hand() -> None:
    m = FidelityMetrics()
    m.update([pair("cd", {"a": 1}, {"a": 1}), pair("ls", {"a": 1, "b": 2}, {"a": 1, "c": 3})])
    m.update([pair("cd", NO_TAG, {"a": 1})])
    out = m.compute()
    # per pair (valid, exact, key, value, err): (1,1,1,1,1), (1,0,.5,.5,1), (0,0,0,0,0)
    assert out["fidelity/pairs"] == 3
    expected = {"json_valid": 2 / 3, "exact_match": 1 / 3, "key_f1": 1.5 / 3, "value_f1": 1.5 / 3,
                "error_agreement": 2 / 3}  # fmt: skip
    for name, value in expected.items():
        assert out[f"fidelity/{name}"].item() == pytest.approx(value), name
    m.reset()
    m.update([])
    assert torch.isnan(m.compute()["fidelity/exact_match"]) and m.compute()["fidelity/pairs"] == 0


def test_tracker_breaks_down_by_benchmark_and_tool() -> None:
    t = FidelityTracker()
    t.update([pair("cd", {"a": 1}, {"a": 1}), pair("ls", {"a": 1}, {"a": 2})])
    t.update([pair("get_user", {"error": "x"}, {"user": "u"}, "tau2")])
    out = t.compute()
    assert out["fidelity/pairs"] == 3 and out["fidelity/pairs/bfcl"] == 2 and out["fidelity/pairs/tau2"] == 1
    assert out["fidelity/exact_match/bfcl"].item() == 0.5
    assert out["fidelity/value_f1/tool/cd"].item() == 1.0 and out["fidelity/value_f1/tool/ls"].item() == 0.0
    assert out["fidelity/key_f1/tool/ls"].item() == 1.0  # same key "a", different value
    assert out["fidelity/error_agreement/tau2"].item() == 0.0
    assert out["fidelity/error_agreement"].item() == pytest.approx(2 / 3)
    t.reset()
    t.update([pair("math.mean", {"r": 1}, {"r": 1})])  # a tool name with a dot (not a valid module key)
    names = ["json_valid", "exact_match", "key_f1", "value_f1", "error_agreement", "decision_f1", "pairs"]
    assert set(t.compute()) == {f"fidelity/{n}{g}" for n in names for g in ["", "/bfcl", "/tool/math.mean"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        t = FidelityTracker()
        if rank == 0:  # each rank sees tools the other never sees
            t.update([pair("cd", {"a": 1}, {"a": 1}), pair("ls", {"a": 1}, {"b": 1})])
        else:
            t.update([pair("pwd", NO_TAG, {"cwd": "/"})])
        results[rank] = {k: float(v) for k, v in t.compute().items()}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_tracker_syncs_lazily_created_groups_across_processes() -> None:
    ctx = mp.get_context("fork")
    results = ctx.Manager().dict()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    assert [p.exitcode for p in procs] == [0, 0]
    assert results[0] == results[1]  # both ranks report the global figures
    out = results[0]
    assert out["fidelity/pairs"] == 3 and out["fidelity/pairs/tool/pwd"] == 1 and out["fidelity/pairs/tool/cd"] == 1
    assert out["fidelity/exact_match"] == pytest.approx(1 / 3) and out["fidelity/json_valid"] == pytest.approx(2 / 3)
    assert out["fidelity/key_f1/tool/ls"] == 0.0 and out["fidelity/value_f1/tool/cd"] == 1.0
