"""ShopWorld over MCP (examples/shopworld_mcp): the task files are ShopWorld's own tasks, and the real
stdio server is the in-process world — the same tool block, the same answer to every call of a sample
of gold and perturbed episodes (every stratum, S5_control's per-task orders included), the same
reward — and a malformed argument, an unknown SKU or order, or a bad world come back as structured
errors, never a crash."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from envace.data.grounding import ground
from envace.data.sources import load_source
from envace.data.sources.shopworld import ENV as LOCAL_ENV
from envace.data.sources.shopworld import load_shopworld
from envace.data.sources.shopworld_verify import oracle_success, perturbations
from envace.envs.base import make_environment
from envace.envs.shopworld import catalogue
from envace.rewards import compute_reward, reward_name
from envace.types import Message, Task, ToolCall, Trajectory

SERVER_ENV = {"kind": "mcp", "server": {"command": "python", "args": ["examples/shopworld_mcp/server.py"]}}

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "shopworld_mcp"
SOURCE = "examples.shopworld_mcp.source:load"  # as a config names it (envace adds the current folder)
# the server imports this checkout's envace, whatever the interpreter has installed
SERVER = {"command": sys.executable, "args": [str(HERE / "server.py")], "env": {"PYTHONPATH": str(ROOT / "src")}}
MCP = {"kind": "mcp", "server": SERVER}
# S1-S4 of tune, a held-out S1 and an S5 world of test (tune's S5 world: below); one process an episode
GOLD = [
    "shopworld-tune-0000",
    "shopworld-tune-0001",
    "shopworld-tune-0002",
    "shopworld-tune-0003",
    "shopworld-test-0000",
    "shopworld-test-0004",
]
# one a stratum; S5's cancels the other pre-existing order, which only the task's own world holds
PERTURBED = [
    ("shopworld-tune-0000", "wrong_sku"),
    ("shopworld-tune-0001", "other_choice"),
    ("shopworld-tune-0002", "other_choice"),
    ("shopworld-tune-0003", "wrong_order_id"),
    ("shopworld-tune-0004", "wrong_order_id"),
]

if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))


def _by_prefix(tasks: dict[str, Task], prefix: str) -> Task:
    return next(t for i, t in tasks.items() if i.startswith(prefix))


@pytest.fixture(scope="module")
def served() -> dict[str, Task]:
    """tune and test from the task files, their tools from the real server's tools/list (once a split)."""
    return {t.id: t for split in ("tune", "test") for t in load_source(SOURCE, split=split, env=MCP)}


@pytest.fixture(scope="module")
def local() -> dict[str, Task]:
    """The same tasks from ShopWorld's own source: the in-process world."""
    return {t.id: t for t in load_shopworld("all")}


def test_the_committed_tasks_are_what_the_generator_writes(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [sys.executable, str(HERE / "make_tasks.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=60,
        env=env,
    )
    for split in ("tune", "test"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (HERE / "tasks" / f"{split}.jsonl").read_text()
    assert sum((HERE / "tasks" / f"{s}.jsonl").stat().st_size for s in ("tune", "test")) < 400_000


@pytest.mark.parametrize("split", ["tune", "test"])
def test_the_rows_are_shopworlds_own_tasks(split: str) -> None:
    rows = load_source(SOURCE, split=split, env=LOCAL_ENV)  # the same rows, run in-process
    own = load_shopworld(split)
    assert [t.id for t in rows] == [t.id for t in own] and len(rows) == {"tune": 200, "test": 500}[split]
    for row, task in zip(rows, own, strict=True):
        assert (row.user_turns, row.gold, row.category, row.system_prompt, row.tools) == (
            task.user_turns,
            task.gold,
            task.category,
            task.system_prompt,
            task.tools,
        )
        assert (row.extra["scored_tools"], row.extra["held_out"]) == (
            task.extra["scored_tools"],
            task.extra["held_out"],
        )
        assert row.extra["metadata"].get("orders") == task.extra["metadata"].get("orders")
        assert reward_name(row) == reward_name(task) == "gold-writes"


def test_the_server_lists_the_in_process_tool_block(served, local) -> None:
    task = served["shopworld-tune-0000-S1_copy"]
    assert task.tools == local[task.id].tools  # names, descriptions, parameters, order; no output schema
    assert [t["name"] for t in task.tools] == [
        "cancel_order",
        "list_orders",
        "order_status",
        "place_order",
        "search_products",
    ]


def test_each_task_chooses_its_world_on_the_command_line_and_only_s5_needs_one(served) -> None:
    plain = [t for t in served.values() if not t.extra["metadata"].get("orders")]
    assert {json.dumps(t.env, sort_keys=True) for t in plain} == {json.dumps(MCP, sort_keys=True)}
    control = [t for t in served.values() if t.category == "S5_control"]
    assert len(control) == 140 and len(plain) == 560
    for task in control:
        args = task.env["server"]["args"]
        assert args[:-2] == SERVER["args"] and args[-2] == "--orders"
        assert json.loads(args[-1]) == task.extra["metadata"]["orders"]


def _replay(task: Task, calls: list[ToolCall]) -> list:
    """Each call as a policy's is run (validated first), in a fresh environment of ``task``."""
    env = make_environment(task)
    assert env is not None
    try:
        return [env.execute(call) for call in calls]
    finally:
        env.close()


def _messages(traj: Trajectory) -> list[tuple]:
    return [(m.role, m.content, m.name, [c.to_dict() for c in m.tool_calls or []]) for m in traj.messages]


@pytest.mark.parametrize("prefix", GOLD)
def test_a_gold_episode_over_mcp_is_the_in_process_one(served, local, prefix: str) -> None:
    task = _by_prefix(served, prefix)
    over_mcp, in_process = ground(task), ground(local[task.id])
    assert _messages(over_mcp) == _messages(in_process)  # every response, as the policy reads it
    assert not any("error" in c.response for c in over_mcp.calls)
    mine, theirs = compute_reward(task, over_mcp), compute_reward(local[task.id], in_process)
    assert (mine.score, mine.success) == (theirs.score, theirs.success) == (1.0, True)


@pytest.mark.parametrize(("prefix", "kind"), PERTURBED)
def test_a_perturbed_episode_fails_the_same_way_over_mcp(served, local, prefix: str, kind: str) -> None:
    task = _by_prefix(served, prefix)
    calls = perturbations(local[task.id], random.Random(0))[kind]
    assert calls is not None
    assert _replay(task, calls) == _replay(local[task.id], calls)
    traj = lambda t: Trajectory(t, [Message("user", t.user_turns[0]), Message("assistant", tool_calls=calls)])  # noqa: E731
    mine, theirs = compute_reward(task, traj(task)), compute_reward(local[task.id], traj(local[task.id]))
    assert (mine.score, mine.success) == (theirs.score, False) and not oracle_success(local[task.id], calls)


def test_unknown_skus_orders_and_bad_arguments_are_structured_errors(served, local) -> None:
    task = served["shopworld-tune-0004-S5_control"]
    existing = task.extra["metadata"]["orders"][0]["order_id"]
    out_of_stock = next(p for p in catalogue().values() if not p.in_stock)
    probes = [
        ToolCall("place_order", {"sku": "ZZZZ", "quantity": 1}),
        ToolCall("place_order", {"sku": out_of_stock.sku, "quantity": 1}),
        ToolCall("place_order", {"sku": out_of_stock.sku, "quantity": 0}),
        ToolCall("order_status", {"order_id": "A9999"}),
        ToolCall("cancel_order", {"order_id": "nope"}),
        ToolCall("cancel_order", {"order_id": existing}),
        ToolCall("cancel_order", {"order_id": existing}),
        ToolCall("place_order", {"sku": "ZZZZ", "quantity": "two"}),
        ToolCall("search_products", {}),
        ToolCall("search_products", {"query": "zzz"}),
        ToolCall("list_orders", {}),
    ]
    answers = _replay(task, probes)
    assert answers == _replay(local[task.id], probes)
    codes = [a["error"] if isinstance(a["error"], str) else a["error"]["code"] for a in answers if "error" in a]
    assert codes == [
        "UNKNOWN_SKU",
        "OUT_OF_STOCK",
        "INVALID_QUANTITY",
        "UNKNOWN_ORDER",
        "UNKNOWN_ORDER",
        "NOT_CANCELLABLE",
        "INVALID_ARGUMENTS",
        "INVALID_ARGUMENTS",
    ]
    assert answers[-2] == {"results": []} and answers[-1]["orders"][0]["status"] == "cancelled"
    env = make_environment(task)  # the server itself, past envace's schema check: the SDK's ToolError
    assert env is not None
    try:
        bad = [
            env.execute(ToolCall("place_order", {"sku": 3, "quantity": "two"}), validate=False),
            env.execute(ToolCall("order_status", {}), validate=False),
            env.execute(ToolCall("__import__", {"name": "os"}), validate=False),
        ]
        assert [b["error"]["code"] for b in bad] == ["TOOL_ERROR"] * 3, bad
        assert "quantity" in bad[0]["error"]["message"] and "__import__" in bad[2]["error"]["message"]
        assert env.execute(ToolCall("list_orders", {}))["orders"][0]["order_id"] == existing  # the session goes on
    finally:
        env.close()


@pytest.mark.parametrize(("orders", "why"), [("[{", "not JSON"), ('[{"order_id": "B1", "sku": "X"}]', "each order")])
def test_a_bad_world_is_one_line_at_start(orders: str, why: str) -> None:
    out = subprocess.run(
        [sys.executable, str(HERE / "server.py"), "--orders", orders],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT / "src")},
    )
    assert out.returncode == 2 and why in out.stderr.splitlines()[-1] and "Traceback" not in out.stderr


def test_a_world_needs_a_stdio_server_and_scored_tools() -> None:
    from examples.shopworld_mcp.source import with_world  # type: ignore[import-not-found]

    orders = [{"order_id": "B1", "sku": "K7Q2", "quantity": 1}]
    at_url = Task(
        "t",
        "tasks",
        env={"kind": "mcp", "server": {"url": "http://127.0.0.1:8000/mcp"}},
        extra={"metadata": {"scored_tools": ["cancel_order"], "orders": orders}},
    )
    with pytest.raises(ValueError, match="a url serves one world"):
        with_world(at_url)
    with pytest.raises(ValueError, match="scored_tools"):
        with_world(Task("t", "tasks", env=MCP, extra={"metadata": {}}))


def test_the_config_is_shopworlds_but_for_its_data_and_name() -> None:
    import yaml

    mine, theirs = (
        yaml.safe_load((ROOT / "configs" / f"{n}.yaml").read_text()) for n in ("mcp_shopworld", "shopworld")
    )
    for key in ("sources", "rl_sources", "val_sources"):
        own = [(s["split"], s.get("options", {}).get("limit")) for s in theirs["data"].pop(key)]
        served = mine["data"].pop(key)
        assert [(s["split"], s["options"].get("limit")) for s in served] == own
        assert {(s["name"], s["path"], json.dumps(s["options"]["env"])) for s in served} == {
            (SOURCE, "examples/shopworld_mcp/tasks", json.dumps(SERVER_ENV))
        }
    assert mine["trainer"]["logger"]["init_args"].pop("name") == "mcp_shopworld"
    assert theirs["trainer"]["logger"]["init_args"].pop("name") == "shopworld"
    assert mine == theirs


@pytest.mark.slow
def test_the_config_fits_against_the_server_with_a_tiny_model(tmp_path: Path, monkeypatch) -> None:
    """configs/mcp_shopworld.yaml end to end (2-layer model, 3 steps, real_env: RL calls the server too),
    from a folder holding the server and freshly written sft, rl and tune files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from envace.cli import lightning_cli

    here = tmp_path / "examples" / "shopworld_mcp"
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [sys.executable, str(HERE / "make_tasks.py"), "--splits", "sft", "rl", "tune", "--out", str(here / "tasks")],
        check=True,
        capture_output=True,
        timeout=60,
        env=env,
    )
    (here / "server.py").symlink_to(HERE / "server.py")
    monkeypatch.chdir(tmp_path)
    tiny = {  # tests/modules/test_shopworld_fit.py's
        "model.init_args.policy.name_or_path": "tiny",
        "data.limit": 8,
        "model.init_args.warm_start_steps": 2,
        "trainer.max_steps": 3,
        "trainer.val_check_interval": 3,
        "data.val_tasks": 5,
        "data.tasks_per_step": 2,
        "model.init_args.group_size": 2,
        "model.init_args.limits.max_new_tokens": 24,
        "model.init_args.limits.max_rehearse_tokens": 24,
        "trainer.precision": "32-true",
        "trainer.num_sanity_val_steps": 0,
    }
    arm = ["--config", str(ROOT / "configs/arms/real_env.yaml")]
    cli = lightning_cli(
        [
            "fit",
            "--config",
            str(ROOT / "configs/mcp_shopworld.yaml"),
            *arm,
            *(x for k, v in tiny.items() for x in (f"--{k}", str(v))),
        ]
    )
    assert cli.trainer.global_step == 3
    assert {t.id.split("-")[1] for t in cli.datamodule.train_set} == {"rl"}
    ea = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents*"))))
    ea.Reload()
    assert {"val/committed/proxy_success/tasks", "train/reward/all"} <= set(ea.Tags()["scalars"])
