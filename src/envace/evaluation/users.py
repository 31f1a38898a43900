"""A local model as the user simulator (tau2, VitaBench): a :data:`~envace.rollout.loop.UserHook`.

tau2's own ``UserSimulator`` calls an LLM through ``tau2.utils.llm_utils`` (litellm, a hosted
model). Here the simulator is our hook instead, so no replacement ``llm_utils`` is needed: the same
local model as the policy (or another one) reads

* a system prompt: tau2's own simulation guidelines (``simulation_guidelines.md`` from the wheel)
  and the task's scenario in ``<scenario>`` tags, as tau2's ``UserSimulator.system_prompt`` builds
  it (VitaBench: its user profile and instructions);
* the conversation role-swapped: the agent's texts as ``user`` messages (the first being tau2's
  opening greeting), the user's earlier messages as ``assistant`` messages; tool traffic is left
  out, as tau2's simulator never sees the agent's tools.

Its reply is the next user turn; tau2's control tokens ``###STOP###``, ``###TRANSFER###`` and
``###OUT-OF-SCOPE###`` end the conversation (recorded in ``episode.user_stop``), and so
does the user-turn limit (``"max_user_turns"``; tau2 counts such a conversation as terminated early).
The simulator does not act on telecom's user-side tools (the phone); telecom's solo mode avoids them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from envace.rollout import Episode, SamplingEngine

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")  # tau2.user.base
GREETING = "Hi! How can I help you today?"  # tau2's orchestrator opens with it (DEFAULT_FIRST_AGENT_MESSAGE)


@dataclass
class UserSimConfig:
    """Who writes the user turns of simulator-driven benchmarks (tau2, VitaBench).

    Args:
        kind: ``simulator`` (a local model plays the user) or ``scripted`` (the task's stand-in
            opening message only; reference policies always use it).
        model: the user's model: ``policy`` (the policy's own weights) or a name/folder as ``--policy``.
        max_user_turns: most user turns per conversation.
        max_new_tokens: most tokens per user message.
        temperature: the user's sampling temperature.
    """

    kind: Literal["simulator", "scripted"] = "simulator"
    model: str = "policy"
    max_user_turns: int = 4
    max_new_tokens: int = 96
    temperature: float = 1.0


@cache
def tau2_guidelines() -> str:
    """tau2's user-simulation guidelines (without tools), read from the wheel."""
    import tau2

    path = Path(tau2.__file__).parent / "data" / "tau2" / "user_simulator" / "simulation_guidelines.md"
    return path.read_text(encoding="utf-8")


def scenario_text(episode: Episode) -> str:
    """The task's scenario as the simulator reads it (tau2's rendering, or VitaBench's profile + goal)."""
    sim = episode.task.user_sim or {}
    if "text" in sim:
        return str(sim["text"])
    if "instructions" in sim:
        profile = json.dumps(sim.get("profile", {}), ensure_ascii=False)
        return f"User profile: {profile}\n\nInstructions: {sim['instructions']}"
    return "\n".join(episode.task.user_turns[:1])


def simulator_messages(episode: Episode) -> list[dict[str, str]]:
    """The simulator's chat: guidelines + scenario, then the conversation role-swapped."""
    system = f"{tau2_guidelines()}\n\n<scenario>\n{scenario_text(episode)}\n</scenario>"
    chat = [{"role": "system", "content": system}, {"role": "user", "content": GREETING}]
    for m in episode.messages:
        if m.role == "user":
            chat.append({"role": "assistant", "content": m.content})
        elif m.role == "assistant" and m.content.strip():
            chat.append({"role": "user", "content": m.content})
    if chat[-1]["role"] == "assistant":  # the agent's last step had no text for the user
        chat.append({"role": "user", "content": "(the agent is waiting for your reply)"})
    return chat


class ModelUser:
    """The user-simulator hook over a generation engine.

    Args:
        engine: the user's sampling engine (its own prefix cache); each reply draws from the episode's
            own random stream (``episode.rng``), so a conversation does not depend on its batch-mates.
        tokenizer: the user's tokenizer (its chat template renders the prompt).
        config: limits and sampling of the user.
    """

    def __init__(self, engine: SamplingEngine, tokenizer: Any, config: UserSimConfig):
        self.engine, self.tokenizer, self.config = engine, tokenizer, config

    def __call__(self, episode: Episode) -> str | None:
        if episode.turn + 1 >= self.config.max_user_turns:
            episode.user_stop = "max_user_turns"
            return None
        text = self.tokenizer.apply_chat_template(
            simulator_messages(episode), tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        sample = self.engine.generate([ids], self.config.max_new_tokens, [episode.rng])[0]
        reply = self.tokenizer.decode(sample.ids, skip_special_tokens=True).strip()
        stop = next((t for t in STOP_TOKENS if t in reply), None)
        if stop is not None or not reply:
            episode.user_stop = stop or "empty"
            return None
        return str(reply)
