"""Drift: every kind transforms responses (and, documented, the tool block) as documented, the same
under the same seed; the wrapped environment runs canonical calls only; the official checkers score
drifted episodes as undrifted ones (BFCL multi-turn's oracle at 100 % under every kind), and nothing
drifted reaches the gold."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.data.sources import load_source
from envace.envs import (
    DRIFT_KINDS,
    DriftedEnvironment,
    DriftSpec,
    accepted_tools,
    canonical_messages,
    canonical_task,
    drifted_task,
    make_environment,
)
from envace.envs.base import json_safe
from envace.envs.bfcl import BFCLEnvironment
from envace.envs.drift import documented_calls
from envace.envs.drift_kinds import (
    DATE_FORMATS,
    FIELDS,
    WRAPPERS,
    added_fields,
    date_choice,
    drift_response,
    drift_tools,
    unit_choice,
)
from envace.envs.drift_support import Chooser, identifier_options
from envace.envs.tau2 import Tau2Environment
from envace.evaluation.bfcl import TrustedEnvironment, official_verdict
from envace.evaluation.official import official_score
from envace.evaluation.tau2 import Tau2Executor, tau2_score
from envace.protocol import render_calls
from envace.protocol.parse import tool_name
from envace.protocol.render import HermesFormat
from envace.rollout import Episode, RealEnvironment, RolloutLimits, make_rollout
from envace.rollout.reference import OracleEngine
from envace.types import Message, ToolCall, is_error

ALL = ",".join(DRIFT_KINDS)
SAMPLE = {
    "current_working_directory": "document",
    "travel_date": "2026-07-01",
    "outsideTemperature": 20.0,
    "matches": [1, 2.5, True, None],
    "credit_card_list": {"144756014165": {"card_balance": 10}},
    "messages": {"USR002": ["hi"]},
}
TOOL_ERROR = {"error": {"code": "EXECUTION_ERROR", "message": "cd: No such file or directory"}}
ORACLE_TASKS = ("multi_turn_base_0", "multi_turn_base_56", "multi_turn_base_168", "multi_turn_miss_func_5",
                "multi_turn_miss_param_3")  # fmt: skip
FMT = HermesFormat(tool_style="compact")
LIMITS = RolloutLimits(max_new_tokens=4096, max_calls_per_step=32, max_episode_tokens=10**6)


@pytest.fixture(scope="module")
def bfcl():
    return {t.id: t for t in load_source("bfcl-multi-turn", split="all")}


def _oracle(tokenizer, task, responder=None) -> Episode:
    engine = OracleEngine(tokenizer, [tokenizer.eos_token_id])  # gold under the names the docs show
    rollout = make_rollout(engine, tokenizer, FMT, responder or TrustedEnvironment(), LIMITS, validate_calls=False)
    return rollout.run([task], 1)[0]


# --------------------------------------------------------------------------- the spec


def test_spec_parses_a_flag_and_refuses_in_one_line() -> None:
    spec = DriftSpec.parse(" rename_keys,add_fields ", mode="silent", seed=4)
    assert spec == DriftSpec(("rename_keys", "add_fields"), "silent", 4)
    assert DriftSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    for bad, why in (("rename_keys,shuffle", "unknown drift kind 'shuffle'"), ("", "at least one kind"),
                     ("units,units", "named twice")):  # fmt: skip
        with pytest.raises(ValueError, match=why) as info:
            DriftSpec.parse(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError) as info:
        DriftSpec.parse("shuffle")
    assert all(kind in str(info.value) for kind in DRIFT_KINDS)
    with pytest.raises(ValueError, match="valid modes: documented, silent"):
        DriftSpec.parse("units", mode="loud")
    with pytest.raises(ValueError, match="must be an integer"):
        DriftSpec(("units",), seed=True)
    with pytest.raises(ValueError, match="unknown drift kind"):
        drift_response("shuffle", {}, Chooser(0))


# --------------------------------------------------------------------------- each kind, pure


@pytest.mark.parametrize("kind", list(DRIFT_KINDS))
def test_every_kind_is_deterministic_and_changes_nothing_it_is_given(kind, bfcl) -> None:
    tools = bfcl["multi_turn_base_168"].tools
    for value in (SAMPLE, TOOL_ERROR, [SAMPLE, 3], {"result": None}):
        before = copy.deepcopy(value)
        out = drift_response(kind, value, Chooser(5))
        assert value == before, "the response given was changed"
        assert out == drift_response(kind, copy.deepcopy(value), Chooser(5))
        json.dumps(out, allow_nan=False)
    before = copy.deepcopy(tools)
    assert drift_tools(kind, tools, Chooser(5)) == drift_tools(kind, copy.deepcopy(tools), Chooser(5))
    assert tools == before, "the tool block given was changed"


@pytest.mark.parametrize("kind", ["rename_keys", "nest_result", "add_fields", "date_format", "reword_errors", "units"])
def test_other_seeds_may_choose_otherwise(kind) -> None:
    value = TOOL_ERROR if kind == "reword_errors" else SAMPLE
    assert len({json.dumps(drift_response(kind, value, Chooser(s))) for s in range(16)}) > 1


@pytest.mark.parametrize("kind", [k for k in DRIFT_KINDS if k != "reword_errors"])
def test_errors_are_left_to_reword_errors(kind) -> None:
    assert drift_response(kind, TOOL_ERROR, Chooser(1)) == TOOL_ERROR


def test_rename_keys_renames_identifiers_only_and_the_docs_alike(bfcl) -> None:
    rng = Chooser(2)
    out = drift_response("rename_keys", SAMPLE, rng)
    keys = list(out)
    for old, new in zip(SAMPLE, keys, strict=True):
        assert new in identifier_options(old)
    assert list(out.values())[:2] == ["document", "2026-07-01"]
    cards = out[keys[4]]
    assert list(cards) == ["144756014165"]  # a data key stays
    assert list(cards["144756014165"])[0] in identifier_options("card_balance")
    assert list(out[keys[5]]) == ["USR002"]
    # the documented schema uses the names the responses use
    tool = next(t for t in bfcl["multi_turn_base_168"].tools if t["name"] == "book_flight")
    props = tool["response"]["properties"]
    documented = drift_tools("rename_keys", [tool], rng)[0]["response"]["properties"]
    assert list(documented) == list(drift_response("rename_keys", dict.fromkeys(props, 0), rng))
    assert list(documented) != list(props)


def test_nest_reorder_and_added_fields_match_their_docs(bfcl) -> None:
    tool = next(t for t in bfcl["multi_turn_base_168"].tools if t["name"] == "book_flight")
    props = tool["response"]["properties"]
    response = dict.fromkeys(props, "x")
    for seed in range(4):
        rng = Chooser(seed)
        nested = drift_response("nest_result", response, rng)
        (key,) = nested
        assert key in WRAPPERS and nested[key] == response
        assert drift_tools("nest_result", [tool], rng)[0]["response"]["properties"] == {key: tool["response"]}
        shuffled = drift_response("reorder_keys", response, rng)
        assert shuffled == response and list(shuffled) != list(response)  # same items, another order
        assert list(drift_tools("reorder_keys", [tool], rng)[0]["response"]["properties"]) == list(shuffled)
        added = drift_response("add_fields", response, rng)
        assert list(added)[: len(response)] == list(response) and len(added) == len(response) + 2
        assert set(added) - set(response) == set(added_fields(rng)) <= set(FIELDS)
        assert set(drift_tools("add_fields", [tool], rng)[0]["response"]["properties"]) == set(added)
    rng = Chooser(0)
    ids = {drift_response("add_fields", {"a": n}, rng).get("request_id") for n in range(3)}
    assert ids == {None} or len(ids) == 3  # when chosen: one per response, the same for the same one


def test_value_formats_numbers_units_and_dates() -> None:
    rng = Chooser(0)
    assert drift_response("numbers_as_strings", {"a": 1, "b": [2.5, True, None], "c": {"d": -3}}, rng) == {
        "a": "1", "b": ["2.5", True, None], "c": {"d": "-3"}
    }  # fmt: skip
    # 20 degrees Celsius is 68 F or 293.15 K; 980 km is 608.94 miles or 980,000 m; booleans stay
    expected = {"degrees Fahrenheit": 68.0, "kelvin": 293.15, "miles": 608.94, "meters": 980000.0}
    seen = set()
    for seed in range(12):
        rng = Chooser(seed)
        out = drift_response("units", {"outsideTemperature": 20.0, "distance": 980, "zipcode": 980, "x": True}, rng)
        temperature, distance = unit_choice("temperature", rng)[0], unit_choice("distance", rng)[0]
        assert out == {"outsideTemperature": expected[temperature], "distance": expected[distance],
                       "zipcode": 980, "x": True}  # fmt: skip
        seen |= {temperature, distance}
    assert seen == set(expected)
    written = {"%m/%d/%Y": "07/01/2026", "%d %b %Y": "01 Jul 2026", "%Y%m%d": "20260701", "%d.%m.%Y": "01.07.2026"}
    assert set(written) == {f for f, _ in DATE_FORMATS}
    for seed in range(8):
        rng = Chooser(seed)
        day = written[date_choice(rng)[0]]
        out = drift_response("date_format", ["2026-07-01", "2026-07-01 14:30:00", "2026-13-45", "soon", 7], rng)
        assert out == [day, f"{day} 14:30:00", "2026-13-45", "soon", 7]


def test_reword_errors_rewords_messages_and_the_tools_own_codes() -> None:
    codes = set()
    for seed in range(12):
        rng = Chooser(seed)
        out = drift_response("reword_errors", TOOL_ERROR, rng)
        codes.add(out["error"]["code"])
        assert "cd: path not found" in out["error"]["message"] and out["error"]["message"] != "cd: path not found"
        refusal = {"error": {"code": "UNKNOWN_TOOL", "message": "no tool named 'x'"}}
        assert drift_response("reword_errors", refusal, rng)["error"]["code"] == "UNKNOWN_TOOL"  # envace's own
        api = drift_response("reword_errors", {"error": "User not authenticated. Please log in."}, rng)["error"]
        assert "not signed in" in api and "kindly log in" in api
        assert drift_response("reword_errors", SAMPLE, rng) == SAMPLE
    assert codes == {"ExecutionError", "E_EXECUTION", "execution.error"}


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12), st.integers(0, 50))  # fmt: skip
def test_any_answer_drifts_without_raising_into_strict_json(value, seed) -> None:
    out = DriftSpec(tuple(DRIFT_KINDS), seed=seed).respond(json_safe(value))
    json.dumps(out, allow_nan=False).encode("utf-8")


# --------------------------------------------------------------------------- the environment


def test_a_renamed_tool_runs_under_its_new_name_and_refuses_its_old_one(bfcl) -> None:
    task = bfcl["multi_turn_base_0"]
    names = [tool_name(t) for t in task.tools]
    seed = next(s for s in range(64) if "mkdir" in DriftSpec(("rename_tool",), seed=s).renaming(names))
    drifted = drifted_task(task, DriftSpec(("rename_tool",), seed=seed))
    env, plain = make_environment(drifted), make_environment(task)
    assert isinstance(env, DriftedEnvironment) and isinstance(env.inner, BFCLEnvironment)
    assert isinstance(plain, BFCLEnvironment)
    old, new, args = "mkdir", env.renaming["mkdir"], {"dir_name": "fresh"}
    assert [tool_name(t) for t in env.tools()] == [tool_name(t) for t in drifted.tools]
    assert new in {tool_name(t) for t in env.tools()} and old not in {tool_name(t) for t in env.tools()}
    refused = env.execute(ToolCall(old, args))
    assert refused["error"]["code"] == "UNKNOWN_TOOL" and repr(new) in refused["error"]["message"]
    assert env.snapshot() == plain.snapshot()  # nothing ran
    assert env.execute(ToolCall(new, args)) == plain.execute(ToolCall(old, args))
    assert env.snapshot() == plain.snapshot() != make_environment(task).snapshot()
    assert env.execute(ToolCall(new, {"dir_name": 3}))["error"]["code"] == "INVALID_ARGUMENTS"  # still validated
    silent = make_environment(drifted_task(task, DriftSpec(("rename_tool",), "silent", seed)))
    assert silent is not None and silent.tools() == task.tools  # the docs as trained


def test_answers_are_the_inner_answers_drifted_and_the_state_undrifted(bfcl) -> None:
    task = bfcl["multi_turn_miss_func_5"]
    spec = DriftSpec(tuple(DRIFT_KINDS), seed=3)
    drifted = drifted_task(task, spec)
    env, plain = make_environment(drifted), make_environment(task)
    assert isinstance(env, DriftedEnvironment) and plain is not None
    changed = 0
    for turn, calls in enumerate(task.gold):
        env.set_turn(turn)
        plain.set_turn(turn)
        assert env.tools() == drifted.tools_at(turn)  # tools added at a turn are drifted alike
        for call in calls:
            real = plain.execute(call, validate=False)
            out = env.execute(documented_calls(drifted, [call])[0], validate=False)
            assert out == spec.respond(real)
            changed += out != real
    assert changed == sum(map(len, task.gold))
    failing = ToolCall("cd", {"folder": "nowhere"})
    error, out = plain.execute(failing), env.execute(documented_calls(drifted, [failing])[0])
    assert is_error(error) and out == spec.respond(error) and out["error"] != error["error"]
    assert env.snapshot() == plain.snapshot()
    assert canonical_task(drifted) == task


def test_canonical_messages_map_names_back_and_drop_refused_calls(bfcl) -> None:
    drifted = drifted_task(bfcl["multi_turn_base_0"], DriftSpec(("rename_tool",), seed=0))
    new = drifted.env["drift"]["renaming"]["cd"]
    messages = [Message("user", "go"), Message("assistant", tool_calls=[ToolCall(new, {"folder": "a"}),
                ToolCall("cd", {"folder": "b"}), ToolCall("pwd")]), Message("tool", "{}", name=new)]  # fmt: skip
    out = canonical_messages(drifted, messages)
    assert [c.name for c in out[1].tool_calls] == ["cd", "pwd"] and out[1].tool_calls[0].arguments == {"folder": "a"}
    assert out[2].name == "cd" and messages[1].tool_calls[0].name == new  # the given messages are not changed
    assert canonical_messages(bfcl["multi_turn_base_0"], messages) is messages
    with pytest.raises(ValueError, match="already drifted"):
        drifted_task(drifted, DriftSpec(("units",)))
    single = load_source("bfcl-single-turn", split="all", categories=["simple_python"])[0]
    with pytest.raises(ValueError, match="no environment to drift"):
        drifted_task(single, DriftSpec(("units",)))


# --------------------------------------------------------------------------- the official checkers


@pytest.mark.parametrize("kinds", [*DRIFT_KINDS, ALL])
def test_the_oracle_scores_full_marks_under_documented_drift(kinds, bfcl, tokenizer) -> None:
    changed = 0
    for task_id in ORACLE_TASKS:
        task = bfcl[task_id]
        gold = copy.deepcopy(task)
        drifted = drifted_task(task, DriftSpec.parse(kinds, seed=1))
        ep = _oracle(tokenizer, drifted)
        plain = _oracle(tokenizer, task)
        verdict = official_verdict(canonical_task(drifted), canonical_messages(drifted, ep.messages), ep.flags)
        assert verdict["valid"], (task_id, verdict)
        score = official_score(ep)  # the checker reads the canonical task and calls itself
        assert score is not None and score.success and score.details["turn_score"] == 1.0, (task_id, score.details)
        tool_turns = [(m.name, m.content) for m in ep.messages if m.role == "tool"]
        changed += tool_turns != [(m.name, m.content) for m in plain.messages if m.role == "tool"]
        assert task == gold and drifted.gold == gold.gold and drifted.extra == gold.extra  # the gold is untouched
        assert canonical_task(drifted) == gold
    assert changed > 0 or kinds == "reword_errors", "the drift never showed in a tool turn"  # gold never fails


@pytest.mark.parametrize("kinds", [k for k in DRIFT_KINDS if k != "rename_tool"])
def test_silent_drift_leaves_the_checker_alone_too(kinds, bfcl, tokenizer) -> None:
    for task_id in ORACLE_TASKS[:3]:
        drifted = drifted_task(bfcl[task_id], DriftSpec.parse(kinds, mode="silent", seed=2))
        assert drifted.tools == bfcl[task_id].tools
        score = official_score(_oracle(tokenizer, drifted))
        assert score is not None and score.success, (task_id, score.details)


def test_tau2_runs_canonical_calls_and_its_db_hash_is_undrifted(tokenizer) -> None:
    task = next(t for t in load_source("tau2", split="train") if t.id == "airline_1")
    drifted = drifted_task(task, DriftSpec.parse(ALL, seed=0))
    assert {tool_name(t) for t in drifted.tools} != {tool_name(t) for t in task.tools}
    ep, plain = _oracle(tokenizer, drifted, RealEnvironment()), _oracle(tokenizer, task, RealEnvironment())
    assert isinstance(ep.env, DriftedEnvironment) and isinstance(plain.env, Tau2Environment)
    assert [c.name for c, _ in ep.env.history()] == [c.name for c, _ in plain.env.history()]
    assert ep.env.db_hashes() == plain.env.db_hashes()
    assert [r.response for r in ep.calls] != [r.response for r in plain.calls]
    assert not any(is_error(r.response) for r in ep.calls)
    out = tau2_score(ep)  # tau2's scorer reads the wrapped environment's history
    assert out.success and out.details["breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    executed = _oracle(tokenizer, drifted, Tau2Executor(trusted=True))  # the evaluation's responder
    assert isinstance(executed.env, DriftedEnvironment) and isinstance(executed.env.inner, Tau2Environment)
    assert tau2_score(executed).success


# --------------------------------------------------------------------------- the rollout under drift


class ReadsTheRefusal(OracleEngine):
    """Calls the renamed gold tools by their old names first (as trained), then, refused, the whole
    turn's gold with the new names the refusals named, then closes."""

    def text_for(self, episode: Episode) -> str:
        renaming = episode.task.env["drift"]["renaming"]
        gold = list(episode.task.gold[episode.turn]) if episode.turn < len(episode.task.gold) else []
        steps = [[c for c in gold if c.name in renaming],
                 [ToolCall(renaming.get(c.name, c.name), c.arguments) for c in gold]]  # fmt: skip
        return render_calls("", steps[episode.steps_in_turn]) if episode.steps_in_turn < 2 else "Done."


def test_silent_rename_tool_lets_the_new_name_reach_the_environment(bfcl, tokenizer) -> None:
    task = bfcl["multi_turn_base_0"].first_turns(1)
    gold_names = {c.name for c in task.gold[0]}
    names = [tool_name(t) for t in task.tools]
    seed = next(s for s in range(64) if gold_names & set(DriftSpec(("rename_tool",), seed=s).renaming(names)))
    drifted = drifted_task(task, DriftSpec(("rename_tool",), "silent", seed))
    renaming = drifted.env["drift"]["renaming"]
    docs, accepted = drifted.tools_at(0), accepted_tools(drifted, 0)
    assert docs == task.tools and {tool_name(t) for t in accepted} == set(names) | set(renaming.values())
    documented = drifted_task(task, DriftSpec(("rename_tool",), "documented", seed))
    assert accepted_tools(documented, 0) == documented.tools_at(0) and accepted_tools(task, 0) == task.tools_at(0)
    engine = ReadsTheRefusal(tokenizer, [tokenizer.eos_token_id])
    rollout = make_rollout(engine, tokenizer, FMT, RealEnvironment(), LIMITS)  # calls validated, as a model's
    ep = rollout.run([drifted], 1)[0]
    refused = [r for r in ep.calls if r.call.name in renaming]
    assert refused and all(r.response["error"]["code"] == "UNKNOWN_TOOL" for r in refused)
    ran = ep.calls[len(refused) :]
    assert [r.call.name for r in ran] == [renaming.get(c.name, c.name) for c in task.gold[0]]
    assert ep.format_errors == 0 and not any(is_error(r.response) for r in ran), [r.response for r in ran]
    score = official_score(ep)
    assert score is not None and score.success, score.details
    traj = ep.trajectory()  # what rewards read: the canonical task and the calls that ran, named as trained
    assert traj.task == task and [r.call for r in traj.calls] == list(task.gold[0])
    assert [c.name for m in traj.messages for c in m.tool_calls] == [c.name for c in task.gold[0]]


def test_tau2_solo_mode_runs_behind_the_drift_too() -> None:
    from envace.evaluation.tau2 import SoloTau2Environment, solo_task, tau2_environment

    task = next(t for t in load_source("tau2", split="test", domains=["telecom"]) if t.extra.get("ticket"))
    drifted = drifted_task(solo_task(task), DriftSpec(("rename_keys",), seed=0))
    env = tau2_environment(drifted)
    assert isinstance(env, DriftedEnvironment) and isinstance(env.inner, SoloTau2Environment)
    assert isinstance(tau2_environment(solo_task(task)), SoloTau2Environment)
    assert [tool_name(t) for t in env.tools()] == [tool_name(t) for t in drifted.tools]
