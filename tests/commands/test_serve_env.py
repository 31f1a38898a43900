"""``envace serve-env`` answers an MCP client's tools/list and tools/call (the SDK's client, over stdio
and over HTTP on 127.0.0.1, two clients at once), and its answers are the checkpoint's own greedy
rehearsal of the same calls; ``--check`` reports every fidelity score, decision F1 included."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import envace
from envace.envs.mcp_bridge import MCPSession
from envace.envs.mcp_spec import ServerSpec

TOOLS = [
    {"name": "place_order", "description": "Order a product; returns the order with its id.",
     "parameters": {"type": "object", "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
                    "required": ["sku", "quantity"]}},
    {"name": "order_status", "description": "The state of an order.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
]  # fmt: skip
CALLS = [("place_order", {"sku": "MUG-BLUE", "quantity": 2}), ("order_status", {"order_id": "A1001"})]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny model saved as a folder (what `envace export` writes) and a config naming a task file."""
    from envace.policy import PolicySpec, load_model

    root = tmp_path_factory.mktemp("serve")
    load_model(PolicySpec("tiny")).save_pretrained(root / "export")
    row = {"user_turns": ["Order 2 blue mugs."], "tools": TOOLS, "system_prompt": "You are the shop's assistant."}
    (root / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    (root / "fit.yaml").write_text(
        f"data:\n  sources:\n    - {{name: tasks, split: all, path: {root / 'tasks.jsonl'}}}\n"
    )
    return root


def _spec(root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "envace.cli", "serve-env", "--fit_config", str(root / "fit.yaml"),
            "--checkpoint", str(root / "export"), "--policy", "tiny",
            "--max_rehearse_tokens", "24", *extra]  # fmt: skip


def _client_answers(spec: ServerSpec) -> tuple[list[str], list[object]]:
    session = MCPSession(spec)
    try:
        names = [t.name for t in session.list_tools()]
        results = [session.call_tool(name, args) for name, args in CALLS]
        answers = [json.loads(r.content[0].text) for r in results]  # the rehearsed JSON, an error one too
        assert [r.is_error for r in results] == ["error" in a for a in answers]
        bad = session.call_tool("place_order", {"sku": 3})
        assert bad.is_error and "INVALID_ARGUMENTS" in bad.content[0].text  # validated, nothing rehearsed
    finally:
        session.close()
    return names, answers


def _own_rehearsal(root: Path) -> list[object]:
    """The checkpoint's greedy rehearsal of the first call, and of the second: after the first when
    its rehearsal ended at its end-of-turn, else alone (a rehearsal cut short by its budget does not
    join the session's history)."""
    from envace.commands.serve_env import WorldModel
    from envace.commands.show import load_actor
    from envace.rollout import RolloutLimits
    from envace.types import ToolCall

    world = WorldModel(load_actor("tiny", str(root / "export"), None, 0), TOOLS, "You are the shop's assistant.",
                       RolloutLimits(max_rehearse_tokens=24, max_episode_tokens=8192))  # fmt: skip
    calls = [ToolCall(n, a) for n, a in CALLS]
    (first,) = world.turns(calls[:1])
    second = world.turns(calls) if first.stopped else world.turns(calls[1:])
    assert not first.stopped or second[0].response == first.response  # greedy: the same context, the same answer
    return [first.response, second[-1].response]


def test_serve_env_over_stdio_answers_as_the_checkpoint_rehearses(served: Path) -> None:
    command, *args = _spec(served)
    here = {"PYTHONPATH": str(Path(envace.__file__).parents[1])}  # the SDK passes a server no PYTHONPATH of ours
    spec = ServerSpec.parse({"command": command, "args": args, "env": here, "connect_timeout_s": 120,
                             "call_timeout_s": 120})  # fmt: skip
    names, answers = _client_answers(spec)
    assert names == ["place_order", "order_status"]
    assert answers == _own_rehearsal(served)  # the second answer saw the first call and its answer as context


def test_serve_env_over_http_on_loopback(served: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(_spec(served, "--port", str(port)), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        spec = ServerSpec(url=f"http://127.0.0.1:{port}/mcp", call_timeout_s=120)
        with ThreadPoolExecutor(2) as clients:  # two clients at once, each its own MCP session
            both = list(clients.map(lambda _: _client_answers(spec), range(2)))
        own = _own_rehearsal(served)
        assert both == [(["place_order", "order_status"], own)] * 2  # neither saw the other's calls
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "rehearsing 2 tools over streamable HTTP at http://127.0.0.1:" in err


def test_check_scores_n_rehearsed_responses_against_the_real_server(served: Path) -> None:
    from envace.commands.serve_env import WorldModel, read_sources
    from envace.commands.show import load_actor
    from envace.rollout import RolloutLimits

    root = Path(__file__).resolve().parents[2]
    train, val, _ = read_sources(str(root / "configs" / "mcp_example.yaml"))
    assert val is not None and train.name == val.name == "tasks"
    tasks = [t.first_turns(1) for t in val.load()[:3]]
    world = WorldModel(load_actor("tiny", str(served / "export"), None, 0), tasks[0].tools, tasks[0].system_prompt,
                       RolloutLimits(max_rehearse_tokens=8, max_episode_tokens=8192))  # fmt: skip
    scores = world.check(tasks, 2)
    assert scores["pairs"] == 2 and scores["tasks"] == 2
    assert 0.0 <= scores["value_f1"] <= 1.0 and scores["exact_match"] == 0.0  # an untrained model matches nothing
    assert 0.0 <= scores["decision_f1"] <= 1.0  # the ids, SKUs, prices a next call reuses: scored too


def test_check_prints_decision_f1(served: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    import shutil

    from envace.commands.serve_env import serve_env

    export = shutil.copytree(served / "export", tmp_path / "export")  # its manifest will name the shop's tools
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the config names the shop's files from the root
    assert serve_env(fit_config="configs/mcp_example.yaml", checkpoint=str(export), check=2,
                     max_rehearse_tokens=8, policy="tiny") == 0  # fmt: skip
    printed = capsys.readouterr().out.splitlines()
    assert "rehearsed 2 responses to the gold calls of 2 val tasks" in printed[0]
    assert printed[1].split()[::2] == ["json_valid", "exact_match", "key_f1", "value_f1", "error_agreement",
                                       "decision_f1"]  # fmt: skip


def test_the_fit_config_is_read_as_envace_fit_reads_it(tmp_path: Path) -> None:
    """Its data in a file of its own (a group's config file, which envace fit takes) and its policy:
    a raw YAML reader found no data.sources in the first and never read the second."""
    from envace.commands.serve_env import read_sources

    (tmp_path / "data.yaml").write_text("sources: [{name: tasks, split: all, path: tasks.jsonl}]\n")
    config = tmp_path / "fit.yaml"
    config.write_text("model:\n  class_path: envace.modules.SFTModule\n  init_args: {policy: {name_or_path: tiny}}\n"
                      "data: data.yaml\n")  # fmt: skip
    train, val, policy = read_sources(str(config))
    assert (train.name, train.split, train.path, val, policy) == ("tasks", "all", "tasks.jsonl", None, "tiny")
    config.write_text("data:\n  sources: [{name: tasks}]\n")
    assert read_sources(str(config))[2] == "smollm2-135m"  # the module's default policy


def test_serve_env_loads_the_policy_its_fit_config_names(
    served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``.ckpt`` that names no base model gets the fit config's, not the packaged model (``--policy``
    still wins)."""
    from envace.commands import serve_env, show

    class Loaded(Exception):
        pass

    def load_actor(policy: str, *args: object) -> None:
        raise Loaded(policy)

    config = tmp_path / "fit.yaml"
    config.write_text((served / "fit.yaml").read_text() + "model:\n  init_args: {policy: {name_or_path: tiny}}\n")
    monkeypatch.setattr(show, "load_actor", load_actor)
    for given, loaded in ((None, "tiny"), ("smollm2-135m", "smollm2-135m")):
        with pytest.raises(Loaded, match=loaded):
            serve_env.serve_env(fit_config=str(config), checkpoint=str(served / "export"), policy=given)
