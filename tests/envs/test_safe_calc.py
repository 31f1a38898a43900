"""tau2's calculate without eval: tau2's answers on its own gold and on generated expressions, bounded work."""

from __future__ import annotations

import builtins
import importlib
import json
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.data.sources.tau2 import tau2_data_dir
from envace.envs.safe_calc import ALLOWED_CHARACTERS, MAX_INT_BITS, CalculationLimit, calculate
from envace.envs.tau2 import CALCULATE_TOOLKITS, ORIGINAL_CALCULATE, SAFE_MARK, Tau2Environment, install_safe_calculate
from envace.types import ToolCall

install_safe_calculate()
ORIGINAL = ORIGINAL_CALCULATE["RetailTools"]  # the three are the same code; trusted text only


def gold_expressions() -> list[str]:
    """Every ``calculate`` expression of every gold action in the wheel's task files."""
    out = []
    for path in sorted(tau2_data_dir().glob("*/tasks*.json")):
        for task in json.loads(path.read_text(encoding="utf-8")):
            for action in (task.get("evaluation_criteria") or {}).get("actions") or []:
                if action["name"] == "calculate":
                    out.append(action["arguments"]["expression"])
    return out


def outcome(fn, expression: str) -> tuple[str, str]:
    """What a calculate gives: ``("ok", text)`` or ``(exception type, message)``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eval warns "'int' object is not callable" on (1)(2)
            return "ok", fn(expression)
    except Exception as exc:
        return type(exc).__name__, str(exc)


def test_gold_expressions_get_tau2s_own_answers() -> None:
    expressions = gold_expressions()
    assert len(expressions) == 15  # 1 airline, 14 retail (telecom and mock have no calculate)
    for expression in expressions:
        assert calculate(expression) == ORIGINAL(None, expression), expression
    env = Tau2Environment("retail")
    for expression in expressions:
        response = env.execute(ToolCall("calculate", {"expression": expression}))
        assert response == {"result": float(ORIGINAL(None, expression))}


@pytest.mark.parametrize(
    "expression",
    [" 1", "  7 / 2", "", " ", "1 +", "()", "(1)(2)", "(1)(1/0)", "...", "-()", "() + 1", "(-8)**0.5",
     "1/0", "1//0", "0.0**-1", "10.0**400", "2**10000/1", "1" * 400 + ".0", "-0.0", "01", "2 ** -1",
     "10.0**300*10.0**300", "10.0**300*10.0**300 - 10.0**300*10.0**300", "-7//2", "2**-2**-2",
     "(2**100)/(3**50)", "1+" * 800 + "1", "2 + x", "1e5"],
)  # fmt: skip
def test_edge_cases_answer_or_fail_as_eval_does(expression: str) -> None:
    assert outcome(calculate, expression) == outcome(lambda e: ORIGINAL(None, e), expression)


numbers = st.from_regex(r"\A(0|[1-9][0-9]{0,3})(\.[0-9]{0,3})?\Z") | st.sampled_from([".5", "00", "1.", "..."])
expressions = st.recursive(
    numbers,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "**", " + ", " ** "]), inner).map("".join),
        inner.map(lambda e: f"({e})"),
        inner.map(lambda e: f"-{e}"),
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(expressions, st.text(alphabet=ALLOWED_CHARACTERS, max_size=16)))
def test_generated_expressions_match_eval_within_the_bounds(expression: str) -> None:
    ours = outcome(calculate, expression)
    if ours[0] == "CalculationLimit":  # eval would compute something huge here: never run it
        return
    assert ours == outcome(lambda e: ORIGINAL(None, e), expression)


@pytest.mark.parametrize(
    "expression",
    ["9**9**9", "2**" + str(MAX_INT_BITS + 1), "(9**999)*(9**999)*(9**999)*(9**999)*(9**999)*(9**999)",
     "(2**16383)+(2**16383)", "1+" * 6000 + "1"],
)  # fmt: skip
def test_bounds_answer_at_once(expression: str) -> None:
    start = time.perf_counter()
    with pytest.raises(CalculationLimit):
        calculate(expression)
    assert time.perf_counter() - start < 0.5


def test_9_9_9_through_the_environment_is_a_tau2_error_at_once() -> None:
    env = Tau2Environment("retail")
    start = time.perf_counter()
    response = env.execute(ToolCall("calculate", {"expression": "9**9**9"}))
    assert time.perf_counter() - start < 0.5
    assert response["error"]["code"] == "EXECUTION_ERROR"
    assert response["error"]["message"].startswith("calculate: power too large")
    _, message = env.history()[-1]
    assert message.error and message.content.startswith("Error: power too large")  # tau2's own shape


def test_every_tau2_calculate_is_ours_even_in_tau2s_own_environments(monkeypatch) -> None:
    def no_eval(*args, **kwargs):
        raise AssertionError("eval called")

    from tau2.environment.toolkit import ToolKitBase

    for module_name, class_name in CALCULATE_TOOLKITS:
        assert getattr(getattr(importlib.import_module(module_name), class_name).calculate, SAFE_MARK)
    for domain in ("airline", "retail", "telecom", "mock"):
        importlib.import_module(f"tau2.domains.{domain}.environment")
    toolkits, todo = [], [ToolKitBase]
    while todo:
        toolkits.append(todo.pop())
        todo.extend(toolkits[-1].__subclasses__())
    calculates = [k.calculate for k in toolkits if hasattr(k, "calculate")]
    assert len(calculates) >= 3 and all(getattr(c, SAFE_MARK, False) for c in calculates)
    monkeypatch.setattr(builtins, "eval", no_eval)
    for domain in ("airline", "retail"):
        # what tau2's evaluator builds to replay a conversation (set_state)
        tau2_env = importlib.import_module(f"tau2.domains.{domain}.environment").get_environment()
        assert tau2_env.tools.use_tool("calculate", expression="2 + 3") == "5.0"
        ours = Tau2Environment(domain)
        assert ours.execute(ToolCall("calculate", {"expression": "(350 - 122) * 2"})) == {"result": 456.0}


def test_the_tool_schema_and_type_are_tau2s() -> None:
    from tau2.environment.tool import as_tool

    tau2_env = importlib.import_module("tau2.domains.retail.environment").get_environment()
    original = as_tool(ORIGINAL.__get__(tau2_env.tools)).openai_schema
    assert tau2_env.tools.get_tools()["calculate"].openai_schema == original
    assert tau2_env.tools.tool_type("calculate").value == "generic"
    install_safe_calculate()  # idempotent: the originals stay the originals
    assert not getattr(ORIGINAL_CALCULATE["RetailTools"], SAFE_MARK, False)
