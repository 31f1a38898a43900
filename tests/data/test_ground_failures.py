"""A gold call that fails for the server's reason (crash, hang, never started) is never a training target:
the task is dropped and counted by code, and past ``max_ground_failed`` the warm start stops in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from envace.data.datamodule import EnvACEDataModule
from envace.data.grounding import GroundFailures, GroundingFailed, GroundingStopped, ground
from envace.types import Task, ToolCall

SERVER = str(Path(__file__).parents[1] / "envs" / "servers" / "misbehaving.py")
TOOLS = [
    {"name": "bump", "description": "Add.", "parameters": {"type": "object", "properties": {"by": {"type": "integer"}}}}
]


def server(mode: str, **deadlines: float) -> dict:
    return {"command": sys.executable, "args": [SERVER, mode], **deadlines}


def task(mode: str, **deadlines: float) -> Task:
    gold = [[ToolCall("bump", {"by": 2}), ToolCall("bump", {"by": 3})]]
    env = {"kind": "mcp", "server": server(mode, **deadlines)}
    return Task(f"t-{mode}", "tasks", tools=TOOLS, user_turns=["bump twice"], gold=gold, env=env)


@pytest.mark.parametrize(
    ("mode", "deadlines", "code"),
    [
        ("crash", {}, "SERVER_CRASHED"),
        ("hang", {"call_timeout_s": 1.0}, "TIMEOUT"),
        ("slow_start", {"connect_timeout_s": 1.5}, "SERVER_UNAVAILABLE"),
    ],
)
def test_a_server_failure_is_never_a_grounded_response(mode: str, deadlines: dict, code: str) -> None:
    with pytest.raises(GroundingFailed) as failed:
        ground(task(mode, **deadlines))
    assert failed.value.code == code and failed.value.call == "bump"
    assert "MCP server" in failed.value.server and "misbehaving.py" in failed.value.server


def test_a_good_server_grounds_its_responses() -> None:
    traj = ground(task("good"))
    assert [r.response for r in traj.calls] == [{"counter": 2}, {"counter": 5}]


def rows(path: Path, n: int) -> str:
    path.write_text("".join(json.dumps({"user_turns": ["bump"], "gold": [[{"name": "bump", "arguments": {}}]],
                                        "tools": TOOLS}) + "\n" for _ in range(n)))  # fmt: skip
    return str(path)


def source(path: str, mode: str) -> dict:
    return {"name": "tasks", "split": "all", "path": path, "options": {"env": {"kind": "mcp", "server": server(mode)}}}


def test_the_warm_start_drops_and_counts_a_crashing_servers_tasks(tokenizer, tmp_path: Path) -> None:
    good, bad = rows(tmp_path / "good.jsonl", 2), rows(tmp_path / "bad.jsonl", 2)
    sources = [source(good, "good"), source(bad, "crash")]
    dm = EnvACEDataModule(sources, tokenizer="tiny", tool_style="compact", max_ground_failed=0.5)
    dm.setup("fit")
    assert dm.counts["grounded"] == 2 and dm.counts["ground_failed"] == 2
    assert dm.counts["ground_failed/SERVER_CRASHED"] == 2 and len(dm.episodes) == 2
    texts = [tokenizer.decode(ep.input_ids) for ep in dm.episodes]
    assert all('"counter": 1' in t and "SERVER_" not in t and "error" not in t for t in texts), texts


def test_the_warm_start_stops_in_one_line_past_the_declared_share(tokenizer, tmp_path: Path) -> None:
    sources = [source(rows(tmp_path / "bad.jsonl", 1), "crash")]
    dm = EnvACEDataModule(sources, tokenizer="tiny", tool_style="compact")  # max_ground_failed 0.1
    with pytest.raises(GroundingStopped) as stopped:
        dm.setup("fit")
    line = stopped.value.lines("envace fit")
    assert "\n" not in line and "misbehaving.py" in line and "SERVER_CRASHED" in line, line
    assert "grounding failed for 1 of 1 tasks" in line and "data.max_ground_failed=0.1" in line


def test_the_share_is_of_the_attempts() -> None:
    failures = GroundFailures()
    failures.failures = [GroundingFailed("a", "MCP server x", "bump", "TIMEOUT", "no answer")]
    failures.check(grounded=9, max_share=0.1)  # 1 of 10: at the share, not above it
    with pytest.raises(GroundingStopped, match="1 of 9 tasks"):
        failures.check(grounded=8, max_share=0.1)
