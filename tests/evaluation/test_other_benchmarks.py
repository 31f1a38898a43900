"""FinMCP-style logs (Replay, tool P/R/F1, exact match) and VitaBench (world-model responder,
required-orders proxy, optional judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.evaluation import PolicyConfig, TaskFilter, UserSimConfig, evaluate
from envace.evaluation.others import VitaBenchmark
from envace.evaluation.policies import load_eval_policy
from envace.evaluation.run import run_setting
from envace.inference import ImaginationConfig
from envace.rewards.judge import LLMJudge
from envace.rollout import RolloutLimits, SamplingConfig

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
    "s": {"type": "string"}}}}} for n in ("quote", "news")]  # fmt: skip


def _call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _log(tmp_path: Path) -> str:
    rec = {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Price of X?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1", "quote", {"s": "X"})]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"price": 1}'},
        {"role": "assistant", "content": "X is 1."},
        {"role": "user", "content": "News?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c2", "news", {"s": "X"})]},
        {"role": "tool", "tool_call_id": "c2", "content": '{"items": []}'},
    ]}  # fmt: skip
    path = tmp_path / "fin.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps({**rec, "id": "second"}) + "\n")
    return str(path)


def test_finmcp_oracle_and_noop(tmp_path: Path) -> None:
    path = _log(tmp_path)
    oracle = evaluate("finmcp", "oracle", tasks=TaskFilter(path=path), out=None, quiet=True)
    got = {r.metric: r.value for r in oracle.rows}
    assert got == {"precision": 1.0, "recall": 1.0, "tf1": 1.0, "exact_match": 1.0, "exact_calls": 1.0}
    assert all(c["response"] in ({"price": 1}, {"items": []}) for it in oracle.items for c in it.calls)  # replayed
    noop = evaluate("finmcp", "noop", tasks=TaskFilter(path=path), out=None, quiet=True)
    assert {r.metric: r.value for r in noop.rows} == dict.fromkeys(got, 0.0)
    with pytest.raises(ValueError, match="tasks.path"):
        evaluate("finmcp", "noop", out=None, quiet=True)


class FakeJudge(LLMJudge):
    def complete(self, messages):
        assert "Checklist" in messages[1]["content"]
        return '{"score": 0.5, "checks": [], "reason": "half"}'


def test_vitabench_noop_scores_zero_and_the_judge_is_read(shared_data: Path, tokenizer) -> None:
    filt = TaskFilter(path=str(shared_data / "vitabench"), categories=["delivery"], limit=2)
    bench = VitaBenchmark(filt, judge=FakeJudge(base_url="http://unused"))
    policy = load_eval_policy("noop")
    items = run_setting(bench, policy, bench.tasks(), ImaginationConfig(), RolloutLimits(), SamplingConfig(), 0, 0, 4)
    assert [it.score for it in items] == [0.0, 0.0] and all(it.turns == 1 and it.calls == [] for it in items)
    rows = {(s.category, s.metric): s.value for s in bench.summarize(items)}
    assert rows == {("delivery", "proxy"): 0.0, ("delivery", "proxy_success"): 0.0, ("delivery", "judge"): 0.5}


def test_vitabench_committed_calls_are_answered_by_the_policy(shared_data: Path) -> None:
    filt = TaskFilter(path=str(shared_data / "vitabench"), categories=["instore"], limit=1)
    limits = RolloutLimits(max_new_tokens=4, max_steps_per_turn=1, max_rehearse_tokens=4)
    result = evaluate("vitabench", "tiny", tasks=filt, limits=limits,
                      imagination=ImaginationConfig("parallel", 1), user=UserSimConfig(kind="scripted"),
                      model=PolicyConfig(tool_style="compact"), out=None, quiet=True)  # fmt: skip
    (item,) = result.items
    assert item.tokens.imagined > 0 and item.imagination[0]["attempts"]
