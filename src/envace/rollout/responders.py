"""Who answers a tool call. One rollout loop, four responders (docs/design.md §2):

* :class:`PolicyRehearsal` — EnvACE: the policy writes the tool turn inline (role ``rehearse``);
* :class:`RealEnvironment` — execute in the task's real environment (context);
* :class:`ExternalSimulator` — a separate frozen model with a ``separate`` simulator prompt (context);
* :class:`Replay` — recorded responses matched by tool name and arguments (context).

A responder either answers a call at once (``respond``) or says what generation writes the answer
(``generation``, within the rollout's ``max_rehearse_tokens``): the rollout then batches that
generation with the other episodes' (continuous batching joins it to the running batch of its
engine).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envace.protocol import parse_rehearsal, tool_name
from envace.rollout.engine import Engine, Sample
from envace.types import JSON, ToolCall, error_observation

if TYPE_CHECKING:
    from envace.rollout.episode import Episode


@dataclass
class ToolTurn:
    """The answer to one call: the response, and the sampled ids when the policy wrote it."""

    response: JSON
    ids: list[int] | None = None
    logprobs: list[float] | None = None
    stopped: bool = True

    @property
    def rehearsed(self) -> bool:
        return self.ids is not None


@dataclass
class Generation:
    """A tool turn written by sampling: ``max_new_tokens`` after ``prompt`` from ``engine``, the sample
    made into the turn by ``turn``; ``own_stream``: drawn from the episode's random stream."""

    engine: Engine
    prompt: list[int]
    max_new_tokens: int
    turn: Callable[[Sample], ToolTurn]
    own_stream: bool = True


class Responder(ABC):
    """Answers the next pending call of each episode."""

    #: whether this responder needs each episode's real environment
    needs_env: bool = False

    @abstractmethod
    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        """One :class:`ToolTurn` per (episode, call) pair, in order."""

    def generation(self, episode: Episode, call: ToolCall, max_new_tokens: int) -> Generation | None:
        """The generation that writes the answer to ``call`` in at most ``max_new_tokens`` tokens, or
        ``None`` when :meth:`respond` answers it."""
        return None

    def bind(self, engine: Engine, tokenizer: Any) -> None:  # noqa: B027 - optional hook
        """Give the responder the policy's engine and tokenizer (called once by the rollout)."""


class SamplingResponder(Responder):
    """A responder whose answers are always sampled (:meth:`generation`): the rollout batches them."""

    @abstractmethod
    def generation(self, episode: Episode, call: ToolCall, max_new_tokens: int) -> Generation: ...

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        raise TypeError(f"{type(self).__name__} answers by sampling: the rollout runs its generation()")


class PolicyRehearsal(SamplingResponder):
    """The policy plays the environment inline: tool-turn header, then it samples the body.

    Args:
        engine: the engine that writes the rehearsals; default: the policy's own (bound by the rollout).
    """

    def __init__(self, engine: Engine | None = None):
        self.engine = engine
        self.tokenizer: Any = None

    def bind(self, engine: Engine, tokenizer: Any) -> None:
        self.engine = self.engine or engine
        self.tokenizer = tokenizer

    def generation(self, episode: Episode, call: ToolCall, max_new_tokens: int) -> Generation:
        assert self.engine is not None, "PolicyRehearsal.bind() was not called"
        return Generation(self.engine, episode.open_tool_turn(), max_new_tokens, self._turn)

    def _turn(self, sample: Sample) -> ToolTurn:
        text = self.tokenizer.decode(sample.ids, skip_special_tokens=True)
        return ToolTurn(parse_rehearsal(text), sample.ids, sample.logprobs, sample.stopped)


class RealEnvironment(Responder):
    """Executes each call in the episode's own real environment (baseline; committed execution)."""

    needs_env = True

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        return [ToolTurn(e.execute_real(c)) for e, c in zip(episodes, calls, strict=True)]


class Replay(Responder):
    """Recorded responses (``task.recorded``): the first unused record with the same name and
    arguments, else the first unused one with the same name; a structured miss otherwise."""

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        return [ToolTurn(self._lookup(e, c)) for e, c in zip(episodes, calls, strict=True)]

    @staticmethod
    def _lookup(episode: Episode, call: ToolCall) -> JSON:
        used = episode.replayed
        records = episode.task.recorded
        for exact in (True, False):
            for i, rec in enumerate(records):
                if i in used or rec.call.name != call.name:
                    continue
                if exact and rec.call.arguments != call.arguments:
                    continue
                used.add(i)
                return rec.response
        return error_observation("REPLAY_MISS", f"no recorded response for {call.name}")


SIMULATOR_PROMPT = """You are simulating the tool `{name}` of a software environment.
Tool schema:
{schema}
{examples}Calls so far in this session and their results:
{history}
Answer the new call exactly as the real tool would: write {open}<JSON object or array>{close} and nothing else."""


class ExternalSimulator(SamplingResponder):
    """A separate frozen model answers calls from a ``separate`` simulator prompt (upstream's
    simulator baseline): the tool's schema, few-shot real results when the task has recorded ones,
    the history of calls, and the call. Its responses are context: the policy is not trained on them.

    Args:
        simulator: the simulator model (name or path, see :class:`~envace.policy.PolicySpec`).
        few_shot: most recorded real results shown as examples.
        engine: a ready engine for the simulator (tests); default: built from ``simulator`` on bind.
        tokenizer: the simulator's tokenizer, with ``engine``.
    """

    def __init__(
        self,
        simulator: str = "smollm2-135m",
        few_shot: int = 2,
        engine: Engine | None = None,
        tokenizer: Any = None,
    ):
        self.simulator, self.few_shot = simulator, few_shot
        self.engine, self.tokenizer = engine, tokenizer

    def bind(self, engine: Engine, tokenizer: Any) -> None:
        if self.engine is not None:
            return
        from envace.policy import PolicySpec, load_policy
        from envace.rollout.engine import GenerationEngine

        model, self.tokenizer = load_policy(PolicySpec(self.simulator))
        model.requires_grad_(False)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.engine = GenerationEngine(model, [self.tokenizer.eos_token_id], pad)

    def prompt(self, episode: Episode, call: ToolCall) -> str:
        from envace.protocol.parse import RESULT_CLOSE, RESULT_OPEN

        tools = {tool_name(t): t for t in episode.task.tools_at(episode.turn)}
        shots = [r for r in episode.task.recorded if r.call.name == call.name][: self.few_shot]
        examples = "".join(f"Example: {json.dumps(r.call.to_dict())} -> {json.dumps(r.response)}\n" for r in shots)
        history = "\n".join(f"{json.dumps(r.call.to_dict())} -> {json.dumps(r.response)}" for r in episode.calls)
        body = SIMULATOR_PROMPT.format(
            name=call.name,
            schema=json.dumps(tools.get(call.name, {})),
            examples=examples,
            history=history or "(none)",
            open=RESULT_OPEN,
            close=RESULT_CLOSE,
        )  # one pass: a second ``format`` would read the schema's braces as fields
        messages = [{"role": "system", "content": body}, {"role": "user", "content": json.dumps(call.to_dict())}]
        text: str = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text

    def generation(self, episode: Episode, call: ToolCall, max_new_tokens: int) -> Generation:
        """The simulator's own prompt; it samples from the global stream (its responses are context)."""
        assert self.engine is not None, "ExternalSimulator.bind() was not called"
        prompt = self.tokenizer(self.prompt(episode, call), add_special_tokens=False)["input_ids"]
        return Generation(self.engine, prompt, max_new_tokens, self._turn, own_stream=False)

    def _turn(self, sample: Sample) -> ToolTurn:
        return ToolTurn(parse_rehearsal(self.tokenizer.decode(sample.ids, skip_special_tokens=True)))
