"""The gold oracle's layouts: ``turn`` writes a turn's gold calls in one act step, so the rehearsal of the
first call already sees the later ones; ``call`` writes one call an act step, as every grounded training
episode is laid out, so each rehearsal sees only the calls before it."""

from __future__ import annotations

import pytest

from envace.data.sources.shopworld import load_shopworld
from envace.protocol.render import HermesFormat
from envace.rollout.loop import RolloutLimits
from envace.rollout.reference import gold_rollout
from envace.rollout.responders import PolicyRehearsal, RealEnvironment

FMT = HermesFormat(tool_style="compact")


def _episode(tokenizer, layout: str):
    """A ShopWorld test task with two gold calls (a search, then an order) through the gold rollout; the
    real environment answers in the rehearsal's place (the layout, not a model, is under test)."""
    task = next(t for t in load_shopworld("test") if len(t.gold[0]) == 2)
    rollout = gold_rollout(tokenizer, FMT, [tokenizer.eos_token_id], RealEnvironment(), RolloutLimits(), layout=layout)
    return task, rollout.run([task], 1, seeds=[0])[0]


@pytest.mark.parametrize("layout", ["turn", "call"])
def test_each_gold_call_is_rehearsed_once_against_its_real_answer(tokenizer, layout: str) -> None:
    task, ep = _episode(tokenizer, layout)
    assert [p.call for p in ep.fidelity] == list(task.gold[0])
    assert [p.rehearsed for p in ep.fidelity] == [p.real for p in ep.fidelity]  # each answered as itself
    assert not ep.flags


def test_the_call_layout_answers_each_call_before_the_next_is_written(tokenizer) -> None:
    order = {layout: [m.role for m in _episode(tokenizer, layout)[1].messages] for layout in ("turn", "call")}
    assert order["turn"] == ["user", "assistant", "tool", "tool", "assistant"]
    assert order["call"] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_an_unknown_layout_is_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="gold layout must be one of turn, call, got 'step'"):
        gold_rollout(tokenizer, FMT, [0], PolicyRehearsal(), RolloutLimits(), layout="step")
