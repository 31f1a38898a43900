"""The drift mitigation: a real response the imagination did not foresee (another shape) makes the
rest of the turn be imagined again from the committed context, which now holds it; off by default."""

from __future__ import annotations

import pytest

from envace.data.sources import load_source
from envace.envs import DriftSpec, drifted_task
from envace.envs.drift_kinds import WRAPPERS
from envace.inference import ImaginationConfig, imagining_rollout
from envace.protocol.memory import HEADER, REVISED_HEADER
from envace.protocol.render import HermesFormat
from envace.rollout import RealEnvironment, RolloutLimits
from envace.rollout.reference import ScriptedEngine
from envace.types import Task

FMT = HermesFormat(tool_style="compact")
TOOL_HEADER = "<|im_start|>tool\n"
IMAGINED = '<execution_result>{"current_working_directory": "/imagined"}</execution_result>'
LIMITS = RolloutLimits(max_steps_per_turn=3, max_episode_tokens=8192)


class Scripted(ScriptedEngine):
    """Calls ``pwd`` at a turn's first step, then closes; rehearses ``pwd`` as undrifted; keeps every prompt."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, [tokenizer.eos_token_id])
        self.prompts: list[str] = []

    def text_for(self, episode):
        text = episode.builder.text()
        self.prompts.append(text)
        if text.endswith(TOOL_HEADER):
            return IMAGINED
        return '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>' if episode.steps_in_turn == 0 else "All set."


@pytest.fixture(scope="module")
def task() -> Task:
    return load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])[0].first_turns(1)


def _run(tokenizer, task: Task, reimagine: int):
    engine = Scripted(tokenizer)
    config = ImaginationConfig("parallel", 2, reimagine=reimagine)
    ep = imagining_rollout(engine, tokenizer, FMT, RealEnvironment(), LIMITS, config).run([task])[0]
    return ep, engine


def test_an_unforeseen_real_response_is_imagined_again_from_the_real_context(tokenizer, task) -> None:
    drifted = drifted_task(task, DriftSpec(("nest_result",), "silent", seed=0))
    ep, engine = _run(tokenizer, drifted, reimagine=1)
    (wrapper,) = ep.calls[0].response  # the real answer, nested: another shape than the rehearsal's
    assert wrapper in WRAPPERS
    first, second = ep.imagined
    assert (first.turn, first.at_call, first.revised) == (0, 0, False)
    assert (second.turn, second.at_call, second.revised) == (0, 1, True) and len(second.attempts) == 2
    text = ep.builder.text()
    real = text.index(f'{{"{wrapper}": ')
    assert text.index(HEADER) < real < text.index(REVISED_HEADER) < text.rindex("<|im_start|>assistant\n")
    # the revised attempts acted from the committed context: the real (drifted) response, no revised note yet
    acts = [p for p in engine.prompts if p.endswith("<|im_start|>assistant\n")]
    revised = [p for p in acts if f'{{"{wrapper}": ' in p and REVISED_HEADER not in p]
    assert len(revised) == 2, "each revised attempt acts once from the real context"
    assert all(p.count(HEADER) == 1 for p in revised)


def test_foreseen_responses_and_the_default_imagine_once(tokenizer, task) -> None:
    plain, _ = _run(tokenizer, task, reimagine=1)  # the real pwd has the rehearsed keys: foreseen
    assert [r.revised for r in plain.imagined] == [False]
    drifted = drifted_task(task, DriftSpec(("nest_result",), "silent", seed=0))
    off, _ = _run(tokenizer, drifted, reimagine=0)  # the default: no revision, whatever the answer
    assert [r.revised for r in off.imagined] == [False] and REVISED_HEADER not in off.builder.text()
    assert ImaginationConfig().reimagine == 0
