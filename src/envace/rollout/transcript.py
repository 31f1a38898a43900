"""An episode as readable text: every segment tagged with its role (``[act]``, ``[rehearse]``,
``[context]``), the system turn summarised and tool blocks shortened to their tool names. The one
episode-to-text renderer: ``envace show`` prints it, ``RolloutLogger`` logs it to TensorBoard."""

from __future__ import annotations

import json
import re

from envace.protocol import tool_name
from envace.rollout.episode import Episode
from envace.types import ROLE_IDS

TAGS = {rid: f"[{role}]" for role, rid in ROLE_IDS.items()}
_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)


def segments(ep: Episode) -> list[tuple[int, list[int]]]:
    """The episode as runs of consecutive tokens with the same role: ``(role_id, ids)``."""
    runs: list[tuple[int, list[int]]] = []
    for tok, role in zip(ep.builder.ids, ep.builder.roles, strict=True):
        if runs and runs[-1][0] == role:
            runs[-1][1].append(tok)
        else:
            runs.append((role, [tok]))
    return runs


def _tool_line_name(line: str) -> str:
    """The tool name of one line of a tool block (a JSON schema, or a compact signature)."""
    try:
        obj = json.loads(line)
        return str(obj.get("function", obj).get("name", "?"))
    except (json.JSONDecodeError, AttributeError):
        return line.split("(")[0].strip()


def _shorten_tools(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        names = [_tool_line_name(line) for line in m.group(1).splitlines() if line.strip()]
        return f"<tools> … {len(names)} tools: {', '.join(names)} … </tools>"

    return _TOOLS_BLOCK.sub(repl, text)


def transcript(ep: Episode) -> str:
    """The episode as readable text: every segment, each line tagged with its role, the system turn
    summarised and tool blocks shortened to their tool names (the one episode-to-text renderer)."""
    tokenizer = ep.builder.encode.tokenizer
    system_len = len(ep.builder.encode(ep.builder.fmt.system(ep.task.system_prompt, ep.task.tools)))
    prompt = ep.task.system_prompt.strip().split("\n")[0]
    prompt = f"prompt {prompt[:80] + ('…' if len(prompt) > 80 else '')!r}; " if prompt else ""
    names = ", ".join(tool_name(t) for t in ep.task.tools)
    lines = [f"[context] <system turn: {system_len} tokens; {prompt}{len(ep.task.tools)} tools: {names}>"]
    pos = 0
    for role, ids in segments(ep):
        start = max(0, system_len - pos)  # the system turn is summarised above
        pos += len(ids)
        if start >= len(ids):
            continue
        text = tokenizer.decode(ids[start:], skip_special_tokens=False)
        if role == ROLE_IDS["context"]:
            text = _shorten_tools(text)
        keep = [line for line in text.strip("\n").split("\n") if line or role != ROLE_IDS["context"]]
        lines += [f"{TAGS[role]} {line}".rstrip() for line in keep]
    return "\n".join(lines)
