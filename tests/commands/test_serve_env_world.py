"""serve-env's world model in-process: calls shaped one per act turn as the warm start laid them out,
the engine built once, arguments bounded before anything is rehearsed, a call the budget cannot reach
left out of the session's history, sessions bounded, two sessions' calls rehearsed at once and every
wait bounded (``BUSY``), and the tools served from a saved manifest."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from envace.commands import serve_env
from envace.commands.serve_env import NOT_REHEARSED, USER_TURN, WorldModel, served_world
from envace.commands.serve_sessions import Session, Sessions
from envace.data.sources import SourceSpec
from envace.rollout import RolloutLimits
from envace.rollout.responders import ToolTurn
from envace.types import Task, ToolCall

TOOLS = [
    {"name": "place_order", "description": "Order a product.", "parameters": {"type": "object",
     "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}}, "required": ["sku", "quantity"]}},
    {"name": "order_status", "description": "The state of an order.", "parameters": {"type": "object",
     "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
]  # fmt: skip
CALLS = [ToolCall("place_order", {"sku": "MUG", "quantity": 2}), ToolCall("order_status", {"order_id": "A1"})]


@pytest.fixture(scope="module")
def world() -> WorldModel:
    from envace.commands.show import load_actor

    limits = RolloutLimits(max_rehearse_tokens=4, max_episode_tokens=8192)
    return WorldModel(load_actor("tiny", None, None, 0), TOOLS, "You are the shop.", limits, max_argument_bytes=1000)


def test_a_session_is_one_call_per_act_turn_as_the_warm_start(world: WorldModel) -> None:
    from types import SimpleNamespace

    from envace.protocol import render_calls
    from envace.rollout.reference import DONE

    task = Task("s", "serve-env", system_prompt="", tools=TOOLS, user_turns=[USER_TURN], gold=[CALLS])
    with world.pool.lend(-1) as (_, rollout):
        oracle = rollout.engine
    acts = [oracle.text_for(SimpleNamespace(task=task, turn=0, steps_in_turn=k)) for k in range(3)]
    assert acts == [render_calls("", [CALLS[0]]), render_calls("", [CALLS[1]]), DONE]  # not both in one turn


def test_the_engine_is_built_once(world: WorldModel, monkeypatch) -> None:
    import envace.rollout as rollout

    with world.pool.lend(-1) as (index, first):  # built here (or by an earlier test of this module's world)
        pass
    built = []
    make_engine = rollout.make_engine
    monkeypatch.setattr(rollout, "make_engine", lambda *a, **k: built.append(1) or make_engine(*a, **k))
    world.rehearse(CALLS[:1])
    world.rehearse(CALLS)
    assert world.pool.workers[index] is first and built == []  # never built again


def test_oversize_arguments_are_refused_before_anything_is_rehearsed(world: WorldModel, monkeypatch) -> None:
    monkeypatch.setattr(world, "rehearse", lambda calls: pytest.fail("rehearsed an oversize call"))
    history: list[ToolCall] = []
    response, failed = world.answer(history, ToolCall("place_order", {"sku": "x" * 2000, "quantity": 1}))
    assert failed and response["error"]["code"] == "INVALID_ARGUMENTS" and "max_argument_bytes" in str(response)
    assert history == []


def turn(response: dict, stopped: bool = True) -> ToolTurn:
    return ToolTurn(response, ids=[7, 8], logprobs=[0.0, 0.0], stopped=stopped)


def test_a_call_the_budget_cannot_reach_does_not_end_the_session(world: WorldModel, monkeypatch) -> None:
    placed = turn({"id": "A1"})
    history = [(CALLS[0], placed)]
    monkeypatch.setattr(world, "turns", lambda *calls, **known: [placed])  # the budget ended before the new call
    assert world.answer(history, CALLS[1]) == (NOT_REHEARSED, True)
    monkeypatch.setattr(world, "turns", lambda *calls, **known: [placed, turn({"state": "se"}, stopped=False)])
    assert world.answer(history, CALLS[1]) == ({"state": "se"}, False)
    assert history == [(CALLS[0], placed)]  # neither joined: the next call is rehearsed after the calls that were
    sent = turn({"state": "sent"})
    monkeypatch.setattr(world, "turns", lambda *calls, **known: [placed, sent])
    assert world.answer(history, CALLS[1]) == ({"state": "sent"}, False) and history[-1] == (CALLS[1], sent)


def test_earlier_turns_are_written_again_not_rehearsed_again(world: WorldModel) -> None:
    encode = world.policy.tokenizer
    ids = encode('{"id": "A1"}', add_special_tokens=False)["input_ids"]
    placed = ToolTurn({"id": "A1"}, ids=ids, logprobs=[0.0] * len(ids), stopped=True)
    with world.pool.lend(-1) as (_, rollout):
        stats = rollout.responder.rehearsal.engine.stats  # the one worker the calls below find free
    before = (stats.tokens, stats.calls)
    turns = world.turns(CALLS, [placed])
    assert turns[0] is placed and len(turns) == 2  # the known turn as it was, the new call's rehearsed
    assert stats.calls - before[1] == 1 and stats.tokens - before[0] <= world.limits.max_rehearse_tokens


def test_sessions_are_bounded_in_count_and_idle_time() -> None:
    now = [0.0]
    sessions = Sessions(max_sessions=3, idle_s=10.0, clock=lambda: now[0])
    for i in range(1000):
        now[0] = i * 0.001
        sessions.history(f"s{i}").append(CALLS[0])
    assert list(sessions.live) == ["s997", "s998", "s999"]
    now[0] = 100.0
    assert sessions.history("new") == [] and list(sessions.live) == ["new"]


def test_tools_are_served_from_the_saved_manifest_without_the_real_server(tmp_path: Path) -> None:
    rows = tmp_path / "tasks.jsonl"
    rows.write_text(json.dumps({"user_turns": ["hi"], "tools": TOOLS, "system_prompt": "You are the shop."}) + "\n")
    export = tmp_path / "export"
    export.mkdir()
    source = SourceSpec("tasks", "all", str(rows))
    assert served_world(source, str(export)) == (TOOLS, "You are the shop.")  # listed, then saved
    assert serve_env.manifest_path(str(export)).is_file()
    rows.unlink()  # no source, no server: the manifest serves
    assert served_world(source, str(export)) == (TOOLS, "You are the shop.")
    assert serve_env.manifest_path(str(tmp_path / "last.ckpt")) == tmp_path / "last.ckpt.tools.json"


def _meeting(world: WorldModel, monkeypatch, parties: int) -> threading.Barrier:
    """Every rollout run of ``world`` waits (5 s at most) until ``parties`` runs are inside at once."""
    from envace.rollout.loop import Rollout

    barrier, run = threading.Barrier(parties, timeout=5), Rollout.run

    def meet(self, *args, **kwargs):
        barrier.wait()
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Rollout, "run", meet)
    return barrier


def test_two_sessions_calls_are_rehearsed_at_once(monkeypatch) -> None:
    from envace.commands.show import load_actor

    limits = RolloutLimits(max_rehearse_tokens=4, max_episode_tokens=8192)
    world = WorldModel(load_actor("tiny", None, None, 0), TOOLS, "You are the shop.", limits, workers=2)
    alone = world.serve(Session(), CALLS[0])  # builds worker 0 before anything waits
    _meeting(world, monkeypatch, parties=2)  # under one lock for every client, the second never enters
    sessions = Sessions()
    answers: dict[str, tuple] = {}

    def client(key: str) -> None:
        answers[key] = world.serve(sessions.session(key), CALLS[0])

    threads = [threading.Thread(target=client, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers == {"a": alone, "b": alone}  # both inside at once, each its own greedy answer
    assert {sessions.session(k).worker for k in "ab"} == {0, 1}


def test_a_sessions_second_call_waits_for_its_first_and_no_wait_is_unbounded(world: WorldModel) -> None:
    session = Session()
    busy_world = WorldModel(world.policy, TOOLS, "You are the shop.", world.limits, workers=1, busy_s=0.2)
    with session.lock:  # its first call still being answered
        began = time.monotonic()
        response, failed = busy_world.serve(session, CALLS[0])
    assert failed and response["error"]["code"] == "BUSY" and time.monotonic() - began < 5
    assert session.history == []
    with busy_world.pool.lend(-1):  # the one worker lent to another session's call
        response, failed = busy_world.serve(Session(), CALLS[0])
    assert failed and response["error"]["code"] == "BUSY" and "--busy_s" in response["error"]["message"]
    assert busy_world.serve(Session(), CALLS[0])[0].get("error", {}).get("code") != "BUSY"  # free again


@pytest.mark.parametrize("bound", ["count", "idle time"])
def test_a_forgotten_sessions_kept_rows_are_freed(world: WorldModel, bound: str) -> None:
    now = [0.0]
    bounds = {"max_sessions": 1 if bound == "count" else 8, "idle_s": 10.0}
    sessions = Sessions(**bounds, clock=lambda: now[0], forget=world.forget)
    first = sessions.session("a")
    with world.pool.lend(-1) as (_, rollout):
        kept = rollout.responder.rehearsal.engine.kept.rows  # the worker a sequential client's calls find free
    before = set(kept)
    for call in (ToolCall("place_order", {"sku": bound, "quantity": 2}), CALLS[1]):  # rows no other test keeps
        world.serve(first, call)
    held = set(kept) - before
    assert held  # the session's rows (its prefix), kept for its next call
    now[0] = 100.0 if bound == "idle time" else 1.0
    other = ToolCall("order_status", {"order_id": "B7"})  # not a's: the same calls would keep the same rows
    world.serve(sessions.session("b"), other)  # "a" forgotten: over the count, or idle too long
    assert "a" not in sessions.live and not held & set(kept)  # its rows went with it
    assert sum(map(len, kept)) <= sum(map(len, before | (set(kept) - before)))
