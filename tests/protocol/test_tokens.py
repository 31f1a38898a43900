"""Tokens in, tokens out: appends never touch ids already in an episode, and the pieces reassemble
the conversation the chat template renders whole."""

from __future__ import annotations

import pytest

from envace.protocol.render import HermesFormat, TemplateFormat, make_format
from envace.protocol.tokens import EpisodeBuilder, PieceEncoder, encode_trajectory
from envace.types import ROLE_IDS, Message, Task, ToolCall, Trajectory

TOOLS = [{"name": "cd", "description": "Change directory. More.", "parameters": {
    "type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}}]  # fmt: skip


def _conversation() -> list[Message]:
    return [
        Message("user", "Go to docs, then list it."),
        Message("assistant", "", [ToolCall("cd", {"folder": "docs"}), ToolCall("cd", {"folder": "x y"})]),
        Message("tool", '{"current_working_directory": "docs"}', name="cd"),
        Message("tool", '{"error": "No such directory: x y"}', name="cd"),
        Message("assistant", "Done: you are in docs."),
        Message("user", "Thanks!"),
        Message("assistant", "You're welcome."),
    ]


def test_smollm2_template_has_no_tools_so_hermes_is_used(tokenizer) -> None:
    assert isinstance(make_format(tokenizer), HermesFormat)


def test_appends_never_change_earlier_ids(tokenizer) -> None:
    fmt = HermesFormat()
    ep = EpisodeBuilder(PieceEncoder(tokenizer), fmt)
    snapshots: list[list[int]] = []

    def check() -> None:
        for snap in snapshots:
            assert ep.ids[: len(snap)] == snap
        snapshots.append(list(ep.ids))

    ep.system("You are a shell agent.", TOOLS)
    check()
    ep.user("hi")
    check()
    ep.context(fmt.assistant().header)
    check()
    # sampled ids are kept as sampled, even where re-tokenising the text would merge them differently
    a, b = tokenizer.encode("do", add_special_tokens=False), tokenizer.encode("cs", add_special_tokens=False)
    sampled = a + b + [tokenizer.eos_token_id]
    assert tokenizer.encode("docs", add_special_tokens=False) != a + b
    ep.sampled(sampled, "act", [-0.5] * len(sampled))
    check()
    ep.context(fmt.assistant().trailer)
    check()
    t = ep.tensors()
    act = t.roles == ROLE_IDS["act"]
    assert t.input_ids[act].tolist() == sampled
    assert t.logprobs[act].tolist() == [-0.5] * len(sampled)
    assert t.loss_mask.tolist() == act.float().tolist()
    with pytest.raises(ValueError):
        ep.sampled([1, 2], "act", [0.0])


def test_episode_decodes_to_the_whole_rendering(tokenizer) -> None:
    fmt = HermesFormat()
    task = Task(id="t", benchmark="test", system_prompt="You are a shell agent.", tools=TOOLS)
    traj = Trajectory(task=task, messages=_conversation())
    ep = encode_trajectory(traj, PieceEncoder(tokenizer), fmt)
    whole = fmt.render(task.system_prompt, TOOLS, traj.messages)
    assert ep.text() == whole
    # SmolLM2's own template is plain ChatML and append-only: rendering it whole gives the same text
    dicts = [
        {
            "role": "system",
            "content": fmt.system(task.system_prompt, TOOLS)[len("<|im_start|>system\n") : -len("<|im_end|>\n")],
        }
    ]
    for m in traj.messages:
        if m.role == "assistant":
            dicts.append({"role": "assistant", "content": fmt.assistant_body(m.content, m.tool_calls)})
        elif m.role == "tool":
            dicts.append({"role": "tool", "content": fmt.tool_body(__import__("json").loads(m.content))})
        else:
            dicts.append(m.to_dict())
    assert tokenizer.apply_chat_template(dicts, tokenize=False) == whole


def test_roles_of_a_grounded_trajectory(tokenizer) -> None:
    fmt = HermesFormat()
    task = Task(id="t", benchmark="test", tools=TOOLS)
    ep = encode_trajectory(Trajectory(task=task, messages=_conversation()), PieceEncoder(tokenizer), fmt)
    t = ep.tensors()

    def text_of(role: str) -> str:
        return tokenizer.decode(t.input_ids[t.roles == ROLE_IDS[role]].tolist())

    assert text_of("act").count("<tool_call>") == 2 and text_of("act").count("<|im_end|>") == 3
    assert text_of("rehearse").count("<execution_result>") == 2
    assert "Go to docs" not in text_of("act") + text_of("rehearse")
    assert "<|im_start|>" not in text_of("act") + text_of("rehearse")


CHATML_WITH_TOOLS = (
    "{%- if tools %}{{ '<|im_start|>system\\n' + (messages[0]['content'] if messages[0]['role'] == 'system' else '')"
    " + '\\n<tools>' }}{%- for t in tools %}{{ '\\n' + (t | tojson) }}{%- endfor %}{{ '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{%- if m['role'] != 'system' %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_template_format_from_a_tools_template(tokenizer) -> None:
    import copy

    tok = copy.copy(tokenizer)
    tok.chat_template = CHATML_WITH_TOOLS
    fmt = make_format(tok, prefer="template")
    assert isinstance(fmt, TemplateFormat)
    assert fmt.assistant().header == "<|im_start|>assistant\n" and fmt.assistant().end == "<|im_end|>"
    assert fmt.tool().header == "<|im_start|>tool\n" and fmt.tool().trailer == "\n"
    task = Task(id="t", benchmark="test", system_prompt="P", tools=TOOLS)
    ep = encode_trajectory(Trajectory(task=task, messages=_conversation()), PieceEncoder(tok), fmt)
    assert ep.text() == fmt.render("P", TOOLS, _conversation())
    assert '"name": "cd"' in ep.text().split("</tools>")[0]
