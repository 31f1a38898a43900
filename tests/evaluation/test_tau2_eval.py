"""tau2 evaluation: official reward on the committed conversation, telecom solo mode, pass^k, and
the local user simulator hook."""

from __future__ import annotations

import pytest

from envace.data.sources import load_source
from envace.evaluation import ModelUser, TaskFilter, UserSimConfig, evaluate
from envace.evaluation.tau2 import Tau2Executor, pass_hat_k, solo_task, tau2_messages, tau2_score
from envace.evaluation.users import simulator_messages
from envace.protocol.render import HermesFormat
from envace.protocol.tokens import PieceEncoder
from envace.rollout import Rollout, RolloutLimits
from envace.rollout.engine import Sample
from envace.rollout.reference import ScriptedEngine

FMT = HermesFormat(tool_style="compact")


def _values(result) -> dict[tuple[str, str], float]:
    return {(r.category, r.metric): r.value for r in result.rows}


def test_oracle_and_noop_on_test_tasks() -> None:
    oracle = _values(evaluate("tau2", "oracle", tasks=TaskFilter(categories=["airline", "telecom"], limit=2),
                              solo=True, out=None, quiet=True))  # fmt: skip
    assert oracle[("airline", "pass^1")] == 1.0 and oracle[("telecom-solo", "pass^1")] == 1.0
    # noop: tau2 pays the do-nothing conversation where nothing must change or be said
    noop = evaluate("tau2", "noop", tasks=TaskFilter(categories=["airline"], limit=5), out=None, quiet=True)
    wins = {it.task_id: it.success for it in noop.items}
    assert wins == {"airline_2": False, "airline_6": True, "airline_8": False, "airline_13": True, "airline_16": False}


def test_pass_hat_k() -> None:
    assert pass_hat_k([3, 0], trials=3, k=1) == pytest.approx(0.5)
    assert pass_hat_k([3, 2], trials=3, k=2) == pytest.approx((1 + 1 / 3) / 2)


class Writes(ScriptedEngine):
    def __init__(self, tokenizer, texts):
        super().__init__(tokenizer, [tokenizer.eos_token_id])
        self.texts = texts

    def text_for(self, episode):
        return self.texts[min(episode.steps_in_turn, len(self.texts) - 1)]


def test_refused_calls_are_left_out_and_limits_score_zero(tokenizer) -> None:
    task = load_source("tau2", split="test", domains=["airline"])[0]
    calls = ('<tool_call>{"name": "get_user_details", "arguments": {"user_id": 7}}</tool_call>'
             '<tool_call>{"name": "get_user_details", "arguments": {"user_id": "nobody"}}</tool_call>')  # fmt: skip
    limits = RolloutLimits(max_steps_per_turn=3)
    ep = Rollout(Writes(tokenizer, [calls, "Bye."]), FMT, PieceEncoder(tokenizer), Tau2Executor(False), limits).run(
        [task]
    )[0]
    # the first call breaks the schema (parse_act drops it); the second reaches tau2 and fails there
    msgs = tau2_messages(ep)
    sent = [c.arguments for m in msgs if getattr(m, "tool_calls", None) for c in m.tool_calls]
    assert sent == [{"user_id": "nobody"}] and msgs[-1].content == "Bye."
    assert tau2_score(ep).score is not None
    ep.flags.add("max_steps")
    assert tau2_score(ep).details["termination"] == "max_steps" and tau2_score(ep).score == 0.0


def test_solo_task_gives_the_agent_both_tool_sets() -> None:
    task = load_source("tau2", split="test", domains=["telecom"])[0]
    solo = solo_task(task)
    names = {t["function"]["name"] for t in solo.tools}
    assert set(task.extra["user_tools"]) <= names and "<ticket>" in solo.system_prompt
    assert [c.name for c in solo.gold[0]] == [a["name"] for a in task.extra["actions"]]


class Says:
    """A stand-in for the user's sampling engine: ``generate`` writes ``text`` for every prompt."""

    def __init__(self, tokenizer, text: str):
        self.ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]

    def generate(self, prompts, max_new_tokens, rngs=None):
        assert rngs is None or len(rngs) == len(prompts)  # one random stream per prompt, never an episode
        return [Sample(self.ids, [0.0] * len(self.ids), stopped=True) for _ in prompts]


def test_model_user_role_swaps_and_stops(tokenizer) -> None:
    task = load_source("tau2", split="test", domains=["airline"])[0]
    cfg = UserSimConfig(max_user_turns=3, max_new_tokens=16)
    first = Says(tokenizer, "I want to change my flight.")
    user = ModelUser(first, tokenizer, cfg)
    ep = Rollout(Writes(tokenizer, ["Sure, your id?"]), FMT, PieceEncoder(tokenizer), Tau2Executor(False),
                 user=user).run([task])[0]  # fmt: skip
    assert [m.content for m in ep.messages if m.role == "user"] == ["I want to change my flight."] * 3
    assert ep.user_stop == "max_user_turns"
    chat = simulator_messages(ep)
    assert chat[0]["role"] == "system" and "<scenario>" in chat[0]["content"]
    assert [m["role"] for m in chat[1:4]] == ["user", "assistant", "user"]  # greeting, user (swapped), agent
    stop = ModelUser(Says(tokenizer, "Thanks! ###STOP###"), tokenizer, cfg)
    ep = Rollout(Writes(tokenizer, ["Done."]), FMT, PieceEncoder(tokenizer), Tau2Executor(False), user=stop).run(
        [task]
    )[0]
    assert ep.messages == [] and ep.user_stop == "###STOP###"


@pytest.mark.slow
def test_a_model_policy_with_the_model_user_and_rehearsal() -> None:
    from envace.evaluation import PolicyConfig
    from envace.inference import ImaginationConfig

    result = evaluate("tau2", "tiny", tasks=TaskFilter(categories=["airline"], limit=1), trials=2,
                      user=UserSimConfig(max_user_turns=2, max_new_tokens=8), model=PolicyConfig(tool_style="compact"),
                      limits=RolloutLimits(max_new_tokens=4, max_steps_per_turn=1, max_rehearse_tokens=4),
                      imagination=ImaginationConfig("parallel", 1), out=None, quiet=True)  # fmt: skip
    assert [it.trial for it in result.items] == [0, 1] and all(it.tokens.imagined == 4 for it in result.items)
    assert {r.metric for r in result.rows} == {"pass^1", "pass^2", "reward"}
