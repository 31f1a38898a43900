"""The one episode-to-text renderer: every segment tagged with its role, tool blocks shortened, and
the TensorBoard form a fenced block that a transcript cannot break out of."""

from __future__ import annotations

from envace.callbacks.rollout import transcript_markdown
from envace.data.sources import load_source
from envace.protocol.render import HermesFormat
from envace.rollout import RealEnvironment, RolloutLimits, make_rollout
from envace.rollout.reference import OracleEngine
from envace.rollout.transcript import segments, transcript

FMT = HermesFormat(tool_style="compact")


def _episode(tokenizer):
    task = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])[0].first_turns(1)
    rollout = make_rollout(OracleEngine(tokenizer, [tokenizer.eos_token_id]), tokenizer, FMT, RealEnvironment(),
                           RolloutLimits(max_new_tokens=512, max_calls_per_step=16))  # fmt: skip
    return rollout.run([task], 1)[0]


def test_transcript_tags_each_segment_and_shortens_the_tools(tokenizer) -> None:
    ep = _episode(tokenizer)
    runs = segments(ep)
    assert sum(len(ids) for _, ids in runs) == len(ep.ids)  # the runs cover the episode, in order
    assert all(a != b for (a, _), (b, _) in zip(runs, runs[1:], strict=False))  # maximal runs
    text = transcript(ep)
    assert text.startswith("[context] <system turn:") and "[act] <tool_call>" in text
    assert ep.task.user_turns[0].split("\n")[0] in text
    assert "<tools>" not in text.split("\n", 1)[1]  # the tool block is summarised, not printed


def test_markdown_form_is_one_fenced_block(tokenizer) -> None:
    ep = _episode(tokenizer)
    md = transcript_markdown(ep, max_chars=300)
    assert md.startswith("```\n") and md.endswith("\n```") and md.count("```") == 2
    assert len(md) < 320 and "…" in md  # cut, and says so
