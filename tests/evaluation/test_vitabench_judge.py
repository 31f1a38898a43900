"""VitaBench keeps its proxy score when the rubric judge fails: the item is flagged, not dropped."""

from __future__ import annotations

import socket

import pytest

from envace.evaluation import TaskFilter
from envace.evaluation.others import VitaBenchmark
from envace.rewards.judge import LLMJudge
from envace.rollout import Episode
from envace.types import CallRecord, Task, ToolCall

ORDER = {"order_id": "T1", "order_type": "delivery", "store_id": "S", "status": "paid",
         "products": [{"product_id": "P", "quantity": 2}]}  # fmt: skip


def episode() -> Episode:
    """Created but not paid: the proxy scores 1 of 2 checks (the scorer reads only task and calls)."""
    task = Task("v1", "vitabench", extra={"required_orders": [ORDER], "initial_orders": {}, "state_rubrics": ["paid"]})
    create = ToolCall("create_delivery_order", {"store_id": "S", "product_ids": ["P"], "product_cnts": [2]})
    return Episode(task, builder=None, group=0, calls=[CallRecord(create, {"order_id": "N7"})])  # type: ignore[arg-type]


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


class RaisingJudge(LLMJudge):
    def __call__(self, task, traj):
        raise RuntimeError("judge bug")


class HalfJudge(LLMJudge):
    def complete(self, messages):
        return '{"score": 0.5}'


@pytest.mark.parametrize(
    "judge",
    [LLMJudge(base_url=closed_port(), max_retries=1), RaisingJudge(base_url="http://unused")],
    ids=["unreachable", "raises"],
)
def test_a_failed_judge_keeps_the_proxy_score(judge: LLMJudge) -> None:
    out = VitaBenchmark(TaskFilter(), judge=judge).score(episode())
    assert out.score == 0.5 and out.details["proxy"] == 0.5 and not out.success
    assert out.details["judge"] is None and out.details["judge_failed"]
    assert "error" in out.details["judge_details"]
    if type(judge) is LLMJudge:
        assert out.details["judge_details"]["judge_failures"] == {"connection": 2}


def test_a_working_judge_is_recorded_beside_the_proxy() -> None:
    out = VitaBenchmark(TaskFilter(), judge=HalfJudge(base_url="http://unused")).score(episode())
    assert out.score == 0.5 and out.details["judge"] == 0.5 and not out.details["judge_failed"]
