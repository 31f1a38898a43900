"""Who answers a tool call. One rollout loop, these responders (docs/design.md §2):

* :class:`PolicyRehearsal` — EnvACE: the policy writes the tool turn inline (role ``rehearse``);
* :class:`Rehearsal` — the same inline turn written by any engine's weights, trained or not: the
  ``separate`` arm's trained simulator (role ``rehearse``, its own weights);
* :class:`ExternalSimulator` — a separate frozen model writes the tool turn, inline by default (the
  same prompt, format and token budget as rehearsal), its tokens context (not trained on);
* :class:`RealEnvironment` — execute in the task's real environment (context);
* :class:`Replay` — recorded responses matched by tool name and arguments (context).

A responder either answers a call at once (``respond``) or says what generation writes the answer
(``generation``, within the rollout's ``max_rehearse_tokens``): the rollout then batches that
generation with the other episodes' (continuous batching joins it to the running batch of its
engine). Every tool turn names its ``writer`` (``policy``, ``simulator``, ``environment``,
``replay``): the episode keeps who wrote each response (``Episode.writers``).
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
    """The answer to one call: the response, and the sampled ids when a model wrote it inline.

    Attributes:
        response: the parsed response (what the episode's record and the rewards see).
        ids: the sampled ids of the tool-turn body, when a model wrote it inline (after the header
            :meth:`Episode.open_tool_turn` appended); ``None``: the rollout renders ``response``.
        logprobs: the sampling log-probs of ``ids``.
        stopped: whether the sample ended at its end-of-turn token (else the episode is truncated).
        trained: whether ``ids`` are the ``rehearse`` role's tokens (the loss sees them) or context.
        writer: who wrote the response (``policy``, ``simulator``, ``environment``, ``replay``, ...).
    """

    response: JSON
    ids: list[int] | None = None
    logprobs: list[float] | None = None
    stopped: bool = True
    trained: bool = True
    writer: str = "policy"

    @property
    def rehearsed(self) -> bool:
        """Whether the turn's ids are ``rehearse`` tokens (sampled inline and trained on)."""
        return self.ids is not None and self.trained


@dataclass
class Generation:
    """A tool turn written by sampling: ``max_new_tokens`` after ``prompt`` from ``engine``, the sample
    made into the turn by ``turn``; ``own_stream``: drawn from the episode's random stream (else the
    global one: a prompt outside the episode, whose samples are not the episode's business)."""

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


class Rehearsal(SamplingResponder):
    """A model plays the environment inline: the tool-turn header is appended to the episode, then
    ``engine``'s weights sample the body from the episode's own context, within the rollout's
    ``max_rehearse_tokens``.

    Args:
        engine: the engine whose weights write the tool turns; default: the policy's (bound by the rollout).
        trained: the sampled ids are ``rehearse`` tokens (the loss trains the weights that wrote
            them); else context.
        writer: the name of the weights that write, kept per tool turn in ``Episode.writers``.
    """

    def __init__(self, engine: Engine | None = None, trained: bool = True, writer: str = "policy"):
        self.engine, self.trained, self.writer = engine, trained, writer
        self.tokenizer: Any = None

    def bind(self, engine: Engine, tokenizer: Any) -> None:
        self.engine = self.engine or engine
        self.tokenizer = tokenizer

    def generation(self, episode: Episode, call: ToolCall, max_new_tokens: int) -> Generation:
        assert self.engine is not None, f"{type(self).__name__}.bind() was not called"
        return Generation(self.engine, episode.open_tool_turn(), max_new_tokens, self._turn)

    def _turn(self, sample: Sample) -> ToolTurn:
        text = self.tokenizer.decode(sample.ids, skip_special_tokens=True)
        return ToolTurn(parse_rehearsal(text), sample.ids, sample.logprobs, sample.stopped, self.trained, self.writer)


class PolicyRehearsal(Rehearsal):
    """EnvACE: the policy writes every tool turn inline as ``rehearse`` tokens (shared weights).

    Args:
        engine: the engine that writes the rehearsals; default: the policy's own (bound by the rollout).
    """

    def __init__(self, engine: Engine | None = None):
        super().__init__(engine, trained=True, writer="policy")


class RealEnvironment(Responder):
    """Executes each call in the episode's own real environment (baseline; committed execution)."""

    needs_env = True

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        return [ToolTurn(e.execute_real(c), writer="environment") for e, c in zip(episodes, calls, strict=True)]


class Replay(Responder):
    """Recorded responses (``task.recorded``): the first unused record with the same name and
    arguments, else the first unused one with the same name; a structured miss otherwise."""

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        return [ToolTurn(self._lookup(e, c), writer="replay") for e, c in zip(episodes, calls, strict=True)]

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


class ExternalSimulator(Rehearsal):
    """A separate frozen model answers calls; its responses are context: the policy is not trained
    on them and they never move the simulator (the ``simulator`` arm; VitaBench's committed responder).

    ``inline`` (default): the simulator writes the tool turn of the episode itself — the same context,
    format and token budget as :class:`PolicyRehearsal`, so a difference between the arms is the
    weights', not a prompt's — drawn from the episode's own stream. It needs the policy's
    tokenizer (the episode's ids are its tokens). ``separate``: upstream's simulator prompt (the
    tool's schema, few-shot recorded results, the calls so far, the call) in the simulator's own
    chat template, for a simulator with another tokenizer; drawn from the global stream.

    Args:
        engine: the simulator's engine (its frozen weights; for training, the module builds it:
            ``EnvACEModule(simulator=...)``).
        tokenizer: the simulator's tokenizer; default (inline): the policy's, bound by the rollout.
        prompt: ``inline`` or ``separate``.
        few_shot: ``separate``: most recorded real results shown as examples.
    """

    def __init__(self, engine: Engine, tokenizer: Any = None, prompt: str = "inline", few_shot: int = 2):
        if prompt not in ("inline", "separate"):
            raise ValueError(f"ExternalSimulator prompt={prompt!r}: expected inline or separate")
        if prompt == "separate" and tokenizer is None:
            raise ValueError("ExternalSimulator prompt='separate' needs the simulator's tokenizer")
        super().__init__(engine, trained=False, writer="simulator")
        self.own_tokenizer, self.prompt_mode, self.few_shot = tokenizer, prompt, few_shot

    def bind(self, engine: Engine, tokenizer: Any) -> None:
        own = self.own_tokenizer
        if self.prompt_mode == "inline" and own is not None and own.get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                "ExternalSimulator(prompt='inline') writes the policy's own tokens: the simulator needs the "
                "policy's tokenizer; use prompt='separate' for a simulator with another vocabulary"
            )
        self.tokenizer = self.own_tokenizer or tokenizer

    def prompt(self, episode: Episode, call: ToolCall) -> str:
        """The ``separate`` prompt of ``call`` in ``episode``, in the simulator's chat template."""
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
        if self.prompt_mode == "inline":
            return super().generation(episode, call, max_new_tokens)
        assert self.engine is not None
        prompt = self.tokenizer(self.prompt(episode, call), add_special_tokens=False)["input_ids"]
        return Generation(self.engine, prompt, max_new_tokens, self._separate_turn, own_stream=False)

    def _separate_turn(self, sample: Sample) -> ToolTurn:
        """A response from the simulator's own prompt: its ids are not the episode's; the rollout renders it."""
        return ToolTurn(parse_rehearsal(self.tokenizer.decode(sample.ids, skip_special_tokens=True)),
                        writer=self.writer)  # fmt: skip
