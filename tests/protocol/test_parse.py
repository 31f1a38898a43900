"""Parsers never raise on model text, and valid calls and results round-trip exactly."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from envace.protocol import (
    CallError,
    RehearsalError,
    parse_act,
    parse_rehearsal,
    render_call,
    render_calls,
    render_result,
    validate_call,
)
from envace.types import ToolCall, is_error

TOOLS = [
    {
        "name": "mv",
        "description": "Move a file.",
        "parameters": {
            "type": "dict",  # BFCL's python-flavoured type names are accepted
            "properties": {"source": {"type": "string"}, "destination": {"type": "string"}},
            "required": ["source", "destination"],
        },
    },
    {"name": "ls", "parameters": {"type": "object", "properties": {"a": {"type": "boolean"}}}},
    {"name": "div", "parameters": {"type": "object", "properties": {"x": {"type": "float"}, "y": {"type": "float"}}}},
]

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(), kids, max_size=4), max_leaves=12
)
calls = st.builds(ToolCall, name=st.text(min_size=1), arguments=st.dictionaries(st.text(), json_values, max_size=5))
plain_text = st.text().filter(lambda t: "<tool_call>" not in t and t == t.strip())


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_act_never_raises(text: str) -> None:
    for tools in (None, TOOLS):
        parsed = parse_act(text, tools, max_calls=2)
        assert len(parsed.calls) == len(parsed.errors)
        for call, err in zip(parsed.calls, parsed.errors, strict=True):
            assert (call is None) != (err is None)
            assert err is None or set(err["error"]) == {"code", "message"}


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_rehearsal_never_raises(text: str) -> None:
    out = parse_rehearsal(text)
    assert is_error(out) or (isinstance(out, dict | list) and out)


TAG_SOUP = [
    "<tool_call>",
    "</tool_call>",
    '{"name": "ls", "arguments": {}}',
    "{",
    "}",
    '"',
    "x",
    "<execution_result>",
    "</execution_result>",
    "[1]",
    "\n",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TAG_SOUP), max_size=12))
def test_parsers_never_raise_on_tag_soup(pieces: list[str]) -> None:
    text = "".join(pieces)
    parse_act(text, TOOLS)
    parse_rehearsal(text)


@settings(max_examples=300, deadline=None)
@given(plain_text, st.lists(calls, max_size=4))
def test_valid_calls_round_trip(content: str, cs: list[ToolCall]) -> None:
    parsed = parse_act(render_calls(content, cs))
    assert parsed.calls == cs
    assert parsed.content == content
    assert parsed.n_errors == 0


@settings(max_examples=300, deadline=None)
@given(json_values.filter(lambda v: isinstance(v, dict | list) and bool(v)))
def test_results_round_trip(value) -> None:
    assert parse_rehearsal(render_result(value)) == value


def test_tags_inside_json_strings_round_trip() -> None:
    """A response or argument holding our own tags (hypothesis found ``{"<execution_result>": None}``)
    reads back as itself, not as a second tag."""
    for value in ({"<execution_result>": None}, ["</execution_result>", "<tool_call>"]):
        assert parse_rehearsal(render_result(value)) == value
    call = ToolCall("echo", {"text": "<tool_call>{}</tool_call> <execution_result>"})
    parsed = parse_act(render_call(call), None)
    assert parsed.calls == [call] and parsed.n_errors == 0


def test_call_errors_have_stable_codes() -> None:
    def code(text: str) -> str:
        return parse_act(text, TOOLS).errors[0]["error"]["code"]

    assert code('<tool_call>{"name": "rm", "arguments": {}}</tool_call>') == CallError.UNKNOWN_TOOL
    assert code('<tool_call>{"name": "mv", "arguments": {"source": "a"}}</tool_call>') == CallError.INVALID_ARGUMENTS
    assert code('<tool_call>{"name": "ls", "arguments": {"a": "yes"}}</tool_call>') == CallError.INVALID_ARGUMENTS
    assert code("<tool_call>{not json}</tool_call>") == CallError.JSON_DECODE
    assert code('<tool_call>["ls"]</tool_call>') == CallError.MALFORMED
    assert code('<tool_call>{"name": "ls", "arguments": 3}</tool_call>') == CallError.MALFORMED
    assert code('<tool_call>{"name": "ls", "arguments": {}}') == CallError.UNCLOSED_TAG
    two = render_call(ToolCall("ls", {})) * 2
    assert parse_act(two, TOOLS, max_calls=1).errors[1]["error"]["code"] == CallError.TOO_MANY_CALLS


def test_zero_one_and_several_calls() -> None:
    assert parse_act("just text", TOOLS).calls == []
    one = parse_act('Sure. <tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>', TOOLS)
    assert one.content == "Sure." and one.calls == [ToolCall("ls", {"a": True})]
    mv = ToolCall("mv", {"source": "a", "destination": "b"})
    several = parse_act(render_calls("", [mv, ToolCall("ls", {}), ToolCall("nope", {})]), TOOLS)
    assert several.calls[:2] == [mv, ToolCall("ls", {})] and several.calls[2] is None
    assert several.errors[2]["error"]["code"] == CallError.UNKNOWN_TOOL


def test_double_encoded_arguments_and_float_types() -> None:
    text = '<tool_call>{"name": "div", "arguments": "{\\"x\\": 1, \\"y\\": 2.5}"}</tool_call>'
    assert parse_act(text, TOOLS).calls == [ToolCall("div", {"x": 1, "y": 2.5})]
    assert validate_call(ToolCall("div", {"x": "one"}), TOOLS)["error"]["code"] == CallError.INVALID_ARGUMENTS


def test_rehearsal_error_codes() -> None:
    cases = {
        "": RehearsalError.EMPTY_OUTPUT,
        "   ": RehearsalError.EMPTY_OUTPUT,
        '{"a": 1}': RehearsalError.NO_TAG,
        '<execution_result>{"a": 1}': RehearsalError.TAG_MALFORMED,
        "<execution_result>{oops}</execution_result>": RehearsalError.JSON_DECODE,
        "<execution_result>{}</execution_result>": RehearsalError.INVALID_RESULT_TYPE,
        "<execution_result>42</execution_result>": RehearsalError.INVALID_RESULT_TYPE,
    }
    for text, expected in cases.items():
        assert parse_rehearsal(text)["error"]["code"] == expected, text
    assert parse_rehearsal(' <execution_result> [1, {"b": null}] </execution_result><|im_end|>') == [1, {"b": None}]
    assert json.loads(json.dumps(parse_rehearsal("x")))  # errors are JSON


# --- adversarial model output (issue: parsers never raise; values a consumer cannot use are errors) ---

HUGE_INT = "9" * 4301  # past Python's int-string limit: json.loads raises a bare ValueError


def _act_code(arguments: str) -> str | None:
    parsed = parse_act(f'<tool_call>{{"name": "ls", "arguments": {arguments}}}</tool_call>')
    return None if parsed.errors[0] is None else parsed.errors[0]["error"]["code"]


def test_unusable_argument_values_are_invalid_arguments() -> None:
    for arguments in (f'{{"a": {HUGE_INT}}}', '{"a": NaN}', '{"a": -Infinity}', '{"a": 1e999}',
                      '{"folder": "\\ud800"}', '{"\\udfff": 1}'):  # fmt: skip
        assert _act_code(arguments) == CallError.INVALID_ARGUMENTS, arguments
    double = json.dumps(json.dumps({"a": float("nan")}))  # double-encoded arguments share the check
    assert _act_code(double) == CallError.INVALID_ARGUMENTS
    assert _act_code('{"a": 12345678901234567890}') is None  # a long but usable integer stays valid
    assert _act_code('{"folder": "\\ud83d\\ude00"}') is None  # a surrogate *pair* is one emoji: fine


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert _act_code(deep) == CallError.INVALID_ARGUMENTS
    assert (
        parse_rehearsal(f"<execution_result>{deep}</execution_result>")["error"]["code"] == RehearsalError.JSON_DECODE
    )
    unclosed = "[" * 100_000
    assert (
        parse_rehearsal(f"<execution_result>{unclosed}</execution_result>")["error"]["code"]
        == RehearsalError.JSON_DECODE
    )


def test_rehearsals_with_unusable_values_are_decode_errors() -> None:
    for body in (f'{{"n": {HUGE_INT}}}', '{"fuel": NaN}', '{"x": Infinity}', '{"name": "\\ud800"}', "[1e400]"):
        out = parse_rehearsal(f"<execution_result>{body}</execution_result>")
        assert out["error"]["code"] == RehearsalError.JSON_DECODE, body
        out["error"]["message"].encode("utf-8")  # the error itself can be tokenised


adversarial_json = st.lists(
    st.sampled_from(['{', '}', '[', ']', '"', ':', ',', '\\', '\\u', 'd800', 'NaN', 'Infinity', '-', '1e999',
                     '9' * 400, '"name"', '"arguments"', '"ls"', ' ', 'true', 'null', '\\ud800', '0.', 'e5'])
    | st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=5),
    max_size=40,
).map("".join)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(adversarial_json)
def test_parsers_never_raise_on_adversarial_json(body: str) -> None:
    for parsed in (
        parse_act(f"<tool_call>{body}</tool_call>", TOOLS),
        parse_act(f'<tool_call>{{"name": "ls", "arguments": {body}}}</tool_call>'),
    ):
        for call in parsed.valid_calls:  # whatever parses as a call holds only usable values
            json.dumps(call.arguments, allow_nan=False, ensure_ascii=False).encode("utf-8")
    out = parse_rehearsal(f"<execution_result>{body}</execution_result>")
    json.dumps(out, allow_nan=False, ensure_ascii=False).encode("utf-8")
