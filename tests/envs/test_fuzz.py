"""Fuzzed dispatch: whatever name and arguments a model writes, an environment answers, never raises, and
every answer is strict JSON that encodes as UTF-8."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.data.sources.bfcl import load_multi_turn
from envace.envs.bfcl import BFCLEnvironment
from envace.envs.tau2 import Tau2Environment
from envace.protocol.parse import tool_name
from envace.types import ToolCall

SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\ud83d\ude00", "\udc80" * 3])
deep = st.integers(min_value=60, max_value=700).map(lambda n: json.loads("[" * n + "]" * n))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**5000), max_value=10**5000),
    st.sampled_from([10**3999, -(10**4001), 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    SURROGATES,
    st.sampled_from(["9**9**9", "1/0", "()", "../../..", "", "*"]),
    deep,
)
keys = st.text(max_size=5) | SURROGATES
values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=6
)


def calls(names: list[str], keys: list[str]) -> st.SearchStrategy[tuple[ToolCall, bool]]:
    """Calls to real and made-up tools with real and made-up argument names, validated or not."""
    name = st.sampled_from(names) | st.text(max_size=12) | SURROGATES
    args = st.dictionaries(st.sampled_from(keys) | st.text(max_size=8) | SURROGATES, values, max_size=4)
    return st.tuples(st.builds(ToolCall, name, args), st.booleans())


def answers_well(env, call: ToolCall, validate: bool) -> None:
    response = env.execute(call, validate=validate)
    json.dumps(response, allow_nan=False).encode("utf-8")


def parameter_names(tools: list[dict]) -> list[str]:
    schemas = [t.get("function", t).get("parameters", {}) for t in tools]
    return sorted({k for s in schemas for k in s.get("properties", {})})


@pytest.fixture(scope="module")
def bfcl_env() -> BFCLEnvironment:
    task = next(t for t in load_multi_turn() if t.id == "multi_turn_base_15")  # file system + MathAPI
    return BFCLEnvironment.from_task(task, call_timeout_s=2.0)


@pytest.fixture(scope="module")
def tau2_env() -> Tau2Environment:
    return Tau2Environment("retail", call_timeout_s=2.0)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


def test_fuzzed_bfcl_calls_always_answer_in_json(bfcl_env) -> None:
    tools = bfcl_env.tools()

    @FUZZ
    @given(calls([tool_name(t) for t in tools] + ["_load_scenario", "__init__"], parameter_names(tools)))
    def run(case: tuple[ToolCall, bool]) -> None:
        answers_well(bfcl_env, *case)

    run()
    assert not bfcl_env.broken  # nothing a fuzzed call did ran past the deadline


def test_fuzzed_tau2_calls_always_answer_in_json(tau2_env) -> None:
    tools = tau2_env.tools()

    @FUZZ
    @given(calls([tool_name(t) for t in tools], parameter_names(tools)))
    def run(case: tuple[ToolCall, bool]) -> None:
        answers_well(tau2_env, *case)
        call, _ = case
        answers_well(tau2_env, ToolCall("calculate", {"expression": call.name}), True)

    run()
    assert not tau2_env.broken
