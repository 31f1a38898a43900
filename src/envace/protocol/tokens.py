"""Tokens in, tokens out: episodes are built by appending token segments (docs/design.md §3.1).

Context pieces (template text, user turns, real tool results in context) are tokenised on their own
and appended; what the policy writes is appended as the exact ids it sampled. Nothing already in an
episode is ever re-tokenised, so the loss is computed on exactly the sampled ids.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from envace.protocol.render import ChatFormat, tool_message_response
from envace.types import ROLE_IDS, Role, Task, ToolSchema, Trajectory

#: the system turn that shows the tools a task adds at a user turn
NEW_TOOLS = "New tools are available."


class PieceEncoder:
    """Tokenises template pieces without special-token additions, memoising the frequent ones.

    The system turn with its tool block is the longest piece and is identical across a group's
    episodes, so it is encoded once.
    """

    def __init__(self, tokenizer: Any, capacity: int = 512):
        self.tokenizer = tokenizer
        self.capacity = capacity
        self._cache: OrderedDict[str, list[int]] = OrderedDict()

    def __call__(self, text: str) -> list[int]:
        if text in self._cache:
            self._cache.move_to_end(text)
            return self._cache[text]
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        self._cache[text] = ids
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return ids


class EpisodeTensors(NamedTuple):
    """One episode as flat tensors, all of shape ``[T]``.

    Attributes:
        input_ids: token ids (long).
        roles: role id per token (``envace.types.ROLE_IDS``: 0 context, 1 act, 2 rehearse).
        logprobs: the sampling log-prob of each policy-written token; 0 on context and on
            teacher-forced text (float).
        loss_mask: 1 where the policy wrote the token (act or rehearse), 0 on context (float).
    """

    input_ids: torch.Tensor
    roles: torch.Tensor
    logprobs: torch.Tensor
    loss_mask: torch.Tensor


@dataclass
class EpisodeBuilder:
    """Appends token segments tagged ``context``, ``act`` or ``rehearse``.

    Args:
        encode: the piece encoder (shared across the episodes of a batch).
        fmt: the chat format giving the template pieces.
    """

    encode: PieceEncoder
    fmt: ChatFormat
    ids: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def _append(self, ids: list[int], role: Role, logprobs: list[float] | None = None) -> slice:
        start = len(self.ids)
        self.ids.extend(ids)
        self.roles.extend([ROLE_IDS[role]] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        return slice(start, len(self.ids))

    def context(self, text: str) -> slice:
        """Append template or environment text the policy did not write."""
        return self._append(self.encode(text), "context")

    def context_ids(self, ids: list[int]) -> slice:
        """Append ids the policy did not write (another model's sample, a rendered response)."""
        return self._append(list(ids), "context")

    def sampled(self, ids: list[int], role: Role, logprobs: list[float]) -> slice:
        """Append ids the policy sampled, with their sampling log-probs."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} ids but {len(logprobs)} log-probs")
        return self._append(list(ids), role, list(logprobs))

    def written(self, text: str, role: Role) -> slice:
        """Append text attributed to a role without sampling it (grounded warm-start data)."""
        return self._append(self.encode(text), role)

    def system(self, prompt: str, tools: list[ToolSchema]) -> slice:
        return self.context(self.fmt.system(prompt, tools))

    def user(self, content: str) -> slice:
        return self.context(self.fmt.user(content))

    def user_turn(self, task: Task, turn: int, text: str | None) -> slice:
        """User turn ``turn`` of ``task``: the tools the task adds at that turn (a system turn), then
        the user's ``text`` (``None``: not known yet, a simulator writes it) — the one place the prompt
        of a turn is built (rollout, warm start, sizing). Returns the span of what was appended."""
        start = len(self.ids)
        added = task.tools_added.get(str(turn))
        if added:
            self.context(self.fmt.system(NEW_TOOLS, added))
        if text is not None:
            self.user(text)
        return slice(start, len(self.ids))

    def text(self) -> str:
        return str(self.encode.tokenizer.decode(self.ids, skip_special_tokens=False))

    def tensors(self) -> EpisodeTensors:
        roles = torch.tensor(self.roles, dtype=torch.long)
        return EpisodeTensors(
            input_ids=torch.tensor(self.ids, dtype=torch.long),
            roles=roles,
            logprobs=torch.tensor(self.logprobs, dtype=torch.float32),
            loss_mask=(roles != ROLE_IDS["context"]).float(),
        )


def encode_trajectory(traj: Trajectory, encode: PieceEncoder, fmt: ChatFormat) -> EpisodeBuilder:
    """A finished trajectory (grounded or recorded) as an episode: its assistant turns are ``act``
    text and its tool turns ``rehearse`` text, everything else context (the warm-start data). A system
    message is a system turn without tools, in context, where it stands (a memory note after a user
    turn: :mod:`envace.data.memory_notes`, as test time's :meth:`envace.inference.Imagination.add_note`).
    A task marked ``extra["rehearse_only"]`` (an exploration transition: docs/shopworld.md) trains the
    rehearse role only: its assistant turns are context, so no act token is a target."""
    task = traj.task
    act: Role = "context" if task.extra.get("rehearse_only") else "act"
    ep = EpisodeBuilder(encode, fmt)
    ep.system(task.system_prompt, task.tools)
    turn = -1
    for m in traj.messages:
        if m.role == "user":
            turn += 1
            ep.user_turn(task, turn, m.content)
        elif m.role == "system":
            ep.system(m.content, [])
        elif m.role == "assistant":
            p = fmt.assistant()
            ep.context(p.header)
            ep.written(fmt.assistant_body(m.content, m.tool_calls) + p.end, act)
            ep.context(p.trailer)
        elif m.role == "tool":
            p = fmt.tool()
            ep.context(p.header)
            ep.written(fmt.tool_body(tool_message_response(m)) + p.end, "rehearse")
            ep.context(p.trailer)
    return ep
