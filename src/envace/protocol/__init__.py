"""The tool-call protocol: rendering, the tokens-in/tokens-out episode builder, and the parsers."""

from envace.protocol.parse import (
    CallError,
    ParsedAct,
    RehearsalError,
    parse_act,
    parse_rehearsal,
    render_call,
    render_calls,
    render_result,
    tool_name,
    validate_call,
)

__all__ = [
    "CallError",
    "ParsedAct",
    "RehearsalError",
    "parse_act",
    "parse_rehearsal",
    "render_call",
    "render_calls",
    "render_result",
    "tool_name",
    "validate_call",
]
