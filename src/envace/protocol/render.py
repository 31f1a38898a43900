"""Chat formats: the text pieces an episode is assembled from (docs/design.md §3.1, §3.3).

An episode is never rendered whole and re-tokenised. Instead a :class:`ChatFormat` hands out the
template pieces around each message — system turn with the tool block, user turn, the header before
the policy writes an assistant or tool turn, the end-of-turn marker it must write, the trailer after
it — and the episode builder tokenises each piece on its own and appends it.

Two formats:

* :class:`HermesFormat` — the built-in fallback: ChatML turns, tools in ``<tools>…</tools>``, calls in
  ``<tool_call>…</tool_call>``, results in a ``tool`` turn as ``<execution_result>JSON</execution_result>``.
* :class:`TemplateFormat` — pieces cut from the tokenizer's own chat template (``tools=``) with
  sentinel messages; used only when the template renders tools and is append-only, checked on a
  probe conversation (else :func:`make_format` falls back to Hermes).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

from envace.protocol.parse import RESULT_CLOSE, RESULT_OPEN, render_calls, render_result
from envace.types import JSON, Message, ToolCall, ToolSchema

log = logging.getLogger(__name__)

ToolStyle = Literal["json", "compact"]

TOOL_INSTRUCTIONS = (
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>\n'
    f"Each call is answered in its own tool turn as {RESULT_OPEN}<JSON object or array>{RESULT_CLOSE}."
)


def tool_message_response(message: Message) -> JSON:
    """The response a tool message carries: its content as JSON, or wrapped when it is plain text.

    >>> tool_message_response(Message("tool", '{"a": 1}')), tool_message_response(Message("tool", "hi"))
    ({'a': 1}, {'result': 'hi'})
    """
    try:
        return json.loads(message.content)
    except json.JSONDecodeError:
        return {"result": message.content}


def _function(tool: ToolSchema) -> dict[str, Any]:
    return tool.get("function", tool)  # type: ignore[no-any-return]


def _schemas(tools: list[ToolSchema]) -> list[dict[str, Any]] | None:
    return [{"type": "function", "function": _function(t)} for t in tools] or None


_MARKER = "Tool description:"


def _own_description(desc: str) -> str:
    """A tool's own text: BFCL prefixes each description with its class blurb ("This tool belongs to
    <class> ... Tool description: <text>", or a single "This tool belongs to <class>." sentence)."""
    if desc.startswith("This tool belongs to"):
        if _MARKER in desc:
            return desc.split(_MARKER, 1)[1].strip()
        return desc.split(". ", 1)[1].strip() if ". " in desc else ""
    return desc


def _returns(fn: dict[str, Any]) -> str:
    """The keys of a tool's documented response, as BFCL's docs give them: the part of
    the contract the rehearsing policy must write, so the compact line keeps it."""
    response = fn.get("response")
    props = response.get("properties") if isinstance(response, dict) else None
    if not isinstance(props, dict) or not props:
        return ""
    keys = list(props)
    return f" -> {{{', '.join(keys)}}}"


def compact_tool(tool: ToolSchema) -> str:
    """One line per tool: signature, documented response keys, and the first sentence of its
    description (docs/design.md §7).

    >>> compact_tool({"name": "cd", "description": "Change dir. Long text.",
    ...               "parameters": {"properties": {"folder": {"type": "string"}}, "required": ["folder"]}})
    'cd(folder: string) - Change dir.'
    >>> compact_tool({"name": "ls", "description": "This tool belongs to the Gorilla file system. It is a simple "
    ...               "file system, which allows users to do things. Tool description: List the files. More."})
    'ls() - List the files.'
    >>> compact_tool({"name": "x", "description": "This tool belongs to the Gorilla file system. It moves files."})
    'x() - It moves files.'
    >>> compact_tool({"name": "pwd", "description": "Print the directory.", "response": {"type": "dict",
    ...               "properties": {"current_working_directory": {"type": "string"}}}})
    'pwd() -> {current_working_directory} - Print the directory.'
    """
    fn = _function(tool)
    params = fn.get("parameters") or {}
    required = set(params.get("required") or [])
    args = []
    for name, schema in (params.get("properties") or {}).items():
        typ = schema.get("type", "any") if isinstance(schema, dict) else "any"
        args.append(f"{name}{'' if name in required else '?'}: {typ}")
    desc = _own_description((fn.get("description") or "").strip())
    first = desc.split(". ")[0].rstrip(".") + "." if desc else ""
    return f"{fn['name']}({', '.join(args)}){_returns(fn)} - {first}".rstrip(" -")


def tool_block(tools: list[ToolSchema], style: ToolStyle = "json") -> str:
    """The tools as the system turn lists them: one JSON object or one compact line per tool."""
    if style == "compact":
        return "\n".join(compact_tool(t) for t in tools)
    return "\n".join(json.dumps({"type": "function", "function": _function(t)}, ensure_ascii=False) for t in tools)


@dataclass(frozen=True)
class TurnPieces:
    """Text around a turn the policy writes: ``header`` + body + ``end`` + ``trailer``.

    ``end`` is the end-of-turn marker the policy itself writes (and is trained on); header and
    trailer are context.
    """

    header: str
    end: str
    trailer: str


class ChatFormat(ABC):
    """The template pieces of one chat protocol."""

    tool_style: ToolStyle = "json"

    @abstractmethod
    def system(self, prompt: str, tools: list[ToolSchema]) -> str:
        """The whole system turn, tools included."""

    @abstractmethod
    def user(self, content: str) -> str:
        """The whole user turn."""

    @abstractmethod
    def assistant(self) -> TurnPieces:
        """Pieces around an assistant (act) turn."""

    @abstractmethod
    def tool(self) -> TurnPieces:
        """Pieces around one tool (rehearse) turn."""

    def assistant_body(self, content: str, calls: list[ToolCall]) -> str:
        """The text of an assistant turn with ``calls`` (what the act role writes)."""
        return render_calls(content, calls)

    def tool_body(self, response: JSON) -> str:
        """The text of a tool turn answering one call (what the rehearse role writes)."""
        return render_result(response)

    def render(self, prompt: str, tools: list[ToolSchema], messages: list[Message]) -> str:
        """A whole conversation as one string (for inspection; episodes are built piecewise)."""
        out = [self.system(prompt, tools)]
        for m in messages:
            if m.role == "user":
                out.append(self.user(m.content))
            elif m.role == "system":  # a note in the conversation (a memory note), tools not repeated
                out.append(self.system(m.content, []))
            elif m.role == "assistant":
                p = self.assistant()
                out.append(p.header + self.assistant_body(m.content, m.tool_calls) + p.end + p.trailer)
            elif m.role == "tool":
                p = self.tool()
                out.append(p.header + self.tool_body(tool_message_response(m)) + p.end + p.trailer)
        return "".join(out)


@dataclass
class HermesFormat(ChatFormat):
    """ChatML with Hermes/Qwen-style tool calls: the built-in fallback.

    Args:
        tool_style: ``json`` (full schemas) or ``compact`` (signature + first sentence).
    """

    tool_style: ToolStyle = "json"
    start: str = "<|im_start|>"
    stop: str = "<|im_end|>"

    def system(self, prompt: str, tools: list[ToolSchema]) -> str:
        text = prompt.strip()
        if tools:
            block = TOOL_INSTRUCTIONS.format(tools=tool_block(tools, self.tool_style))
            text = f"{text}\n\n# Tools\n\n{block}" if text else f"# Tools\n\n{block}"
        return f"{self.start}system\n{text}{self.stop}\n"

    def user(self, content: str) -> str:
        return f"{self.start}user\n{content}{self.stop}\n"

    def assistant(self) -> TurnPieces:
        return TurnPieces(f"{self.start}assistant\n", self.stop, "\n")

    def tool(self) -> TurnPieces:
        return TurnPieces(f"{self.start}tool\n", self.stop, "\n")


_SENTINEL = "\u2063ENVACE-SENTINEL\u2063"


class TemplateFormat(ChatFormat):
    """Pieces cut from the tokenizer's chat template, when it renders tools and is append-only."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        self._assistant = self._pieces(base, {"role": "assistant", "content": _SENTINEL})
        call = {"type": "function", "function": {"name": "f", "arguments": {}}}
        asst = {"role": "assistant", "content": "", "tool_calls": [call]}
        self._tool = self._pieces([*base, asst], {"role": "tool", "name": "f", "content": _SENTINEL})
        self._check_append_only()

    def _render(self, messages: list[dict[str, Any]], tools: list[ToolSchema] | None = None) -> str:
        text: str = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        return text

    def _diff(self, prefix: list[dict[str, Any]], full: list[dict[str, Any]]) -> str:
        a, b = self._render(prefix), self._render(full)
        if not b.startswith(a):
            raise ValueError("chat template is not append-only")
        return b[len(a) :]

    def _pieces(self, prefix: list[dict[str, Any]], msg: dict[str, Any]) -> TurnPieces:
        piece = self._diff(prefix, [*prefix, msg])
        header, _, after = piece.partition(_SENTINEL)
        if not after.startswith(self.eos):
            raise ValueError("chat template does not end turns with the eos token")
        return TurnPieces(header, self.eos, after[len(self.eos) :])

    def _check_append_only(self) -> None:
        probe = [Message("user", "u1"), Message("assistant", "", [ToolCall("f", {"a": 1})]),
                 Message("tool", '{"x": 1}', name="f"), Message("tool", "[2]", name="f"),
                 Message("assistant", "done"), Message("user", "u2")]  # fmt: skip
        tools = [{"name": "f", "description": "F.", "parameters": {"type": "object", "properties": {}}}]
        dicts = [{"role": "system", "content": "P"}] + [self._as_template(m) for m in probe]
        if self.render("P", tools, probe) != self._render(dicts, tools=_schemas(tools)):
            raise ValueError("chat template pieces do not reassemble the whole conversation")

    def _as_template(self, m: Message) -> dict[str, Any]:
        if m.role == "assistant":
            return {"role": "assistant", "content": self.assistant_body(m.content, m.tool_calls)}
        if m.role == "tool":
            return {"role": "tool", "name": m.name, "content": self.tool_body(tool_message_response(m))}
        return m.to_dict()

    def system(self, prompt: str, tools: list[ToolSchema]) -> str:
        return self._render([{"role": "system", "content": prompt}], tools=_schemas(tools))

    def user(self, content: str) -> str:
        return self._diff(
            [{"role": "system", "content": "S"}],
            [{"role": "system", "content": "S"}, {"role": "user", "content": content}],
        )

    def assistant(self) -> TurnPieces:
        return self._assistant

    def tool(self) -> TurnPieces:
        return self._tool


def supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools=`` argument."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def make_format(tokenizer: Any, prefer: str = "auto", tool_style: ToolStyle = "json") -> ChatFormat:
    """The chat format for ``tokenizer``.

    Args:
        tokenizer: the policy's tokenizer.
        prefer: ``auto`` (the template when it supports tools and is append-only, else Hermes),
            ``template`` or ``hermes``.
        tool_style: tool rendering of the Hermes format, ``json`` or ``compact``.
    """
    if prefer == "hermes" or (prefer == "auto" and not supports_tools(tokenizer)):
        return HermesFormat(tool_style=tool_style)
    try:
        return TemplateFormat(tokenizer)
    except Exception as exc:  # a template we cannot cut into pieces
        if prefer == "template":
            raise
        log.warning("chat template unusable piecewise (%s); using the built-in Hermes format", exc)
        return HermesFormat(tool_style=tool_style)
