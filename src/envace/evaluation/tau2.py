"""tau2-bench: the official rule-based reward on the committed conversation, a local user simulator,
telecom solo mode, and pass^k over trials.

* The committed episode runs against the task's real tau2 environment. Its conversation becomes tau2
  messages (user texts, agent texts, and each executed call with tau2's own ``ToolMessage`` from the
  environment's history, so tau2's replay check sees exactly what was returned); calls our schema
  check refused never reached the environment and are left out. tau2's ``evaluate_simulation``
  (``EvaluationType.ALL``: DB, env assertions, actions, communicate) scores it
  (:func:`envace.data.sources.tau2.official_reward`). A conversation that ended on a limit (user
  turns, steps, tokens) is terminated early and scores 0, as tau2 scores ``MAX_STEPS``.
* Users: :class:`~envace.evaluation.users.ModelUser` (a local model with tau2's guidelines), or
  the task's stand-in opening message (``scripted``; always for reference policies).
* Telecom's normal mode needs the customer to act on the phone (user-side tools), which the local
  simulator does not do. Solo mode (``solo=True``, telecom): tau2's solo agent prompt with the
  ticket, the agent holds both tool sets, no user; scored with ``solo_mode=True``.
* pass^k (tau2's metric): with ``c`` successes (reward 1) in ``n`` trials of a task,
  ``pass^k = C(c, k) / C(n, k)``, averaged over tasks.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from functools import cache
from math import comb
from typing import Any

from envace.data.sources import load_source
from envace.data.sources.tau2 import official_reward
from envace.envs import DriftedEnvironment, Environment, canonical_task, documented_calls, make_environment, with_drift
from envace.envs.base import ENVIRONMENT_BROKEN, TIMEOUT
from envace.envs.tau2 import Tau2Environment, tool_schemas
from envace.evaluation.base import Benchmark, ItemResult, Summary, TaskFilter, by_category, mean
from envace.evaluation.policies import Policy
from envace.evaluation.users import ModelUser, UserSimConfig
from envace.protocol import render_calls
from envace.protocol.parse import CallError
from envace.rewards import LIMIT_FAILS
from envace.rewards.base import RewardOutput
from envace.rollout import Episode, SamplingConfig, make_engine
from envace.rollout.loop import UserHook, scripted_user
from envace.rollout.responders import Responder, ToolTurn
from envace.types import JSON, MAX_STEPS, Task, ToolCall, ToolSchema, is_error

DOMAINS = ("airline", "retail", "telecom")
SOLO_DOMAINS = ("telecom",)  # tau2's solo mode needs a ticket; only telecom's tasks have one
EARLY_STOP_FLAGS = LIMIT_FAILS["tau2"]
SOLO_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
You will be provided with a ticket that contains the user's request.
You will need to plan and call the appropriate tools to solve the ticket.

You cannot communicate with the user, only make tool calls.
Stop when you consider that you have solved the ticket: reply with a short message and no tool call.

Always follow the policy. Always make sure you generate valid JSON only."""
SOLO_PROMPT = (
    "<instructions>\n{instruction}\n</instructions>\n<policy>\n{policy}\n</policy>\n<ticket>\n{ticket}\n</ticket>"
)
SOLO_USER_TURN = "Resolve the ticket."
# our checks and deadlines: the call never ran to its end, and tau2's history does not hold it
_REFUSED = {CallError.UNKNOWN_TOOL, CallError.INVALID_ARGUMENTS, TIMEOUT, ENVIRONMENT_BROKEN}


# --------------------------------------------------------------------------- solo mode


class SoloTau2Environment(Tau2Environment):
    """A tau2 environment in solo mode: the agent calls its own tools and the user's (by name)."""

    def tools(self) -> list[ToolSchema]:
        return [*super().tools(), *self.user_tools()]

    def execute(self, call: ToolCall, validate: bool = True) -> JSON:
        if call.name in {t["function"]["name"] for t in self.user_tools()}:
            return self.execute_user(call, validate)
        return super().execute(call, validate)


@cache
def solo_setup(domain: str) -> tuple[str, list[ToolSchema]]:
    """tau2's solo-mode policy text of ``domain`` and the user's tool schemas."""
    env = importlib.import_module(f"tau2.domains.{domain}.environment").get_environment(solo_mode=True)
    return env.get_policy(), tool_schemas(env.user_tools)


def solo_task(task: Task) -> Task:
    """A telecom task in solo mode: the ticket in tau2's solo prompt, both tool sets, the gold
    actions of both sides as one turn of agent calls."""
    policy, user_tools = solo_setup(task.category)
    prompt = SOLO_PROMPT.format(instruction=SOLO_INSTRUCTION, policy=policy, ticket=task.extra["ticket"])
    gold = [ToolCall(a["name"], dict(a["arguments"])) for a in task.extra["actions"]]
    extra = {**task.extra, "solo": True}
    return dataclasses.replace(task, system_prompt=prompt, tools=[*task.tools, *user_tools],
                               user_turns=[SOLO_USER_TURN], gold=[gold], extra=extra)  # fmt: skip


def tau2_environment(task: Task) -> Environment:
    """The task's tau2 environment (solo mode's for a solo task), behind the task's drift when it has one."""
    if task.extra.get("solo"):
        return with_drift(task, SoloTau2Environment.from_task(canonical_task(task)))
    env = make_environment(task)
    if env is None:
        raise ValueError(f"task {task.id}: no tau2 environment")
    return env


def tau2_inner(env: Environment | None) -> Environment | None:
    """The tau2 environment itself (behind a drift: the one it wraps, whose history is tau2's)."""
    return env.inner if isinstance(env, DriftedEnvironment) else env


class Tau2Executor(Responder):
    """Committed execution in the task's tau2 environment (solo or not, drifted or not); reference
    policies run without the schema check (gold, as tau2's evaluator replays it)."""

    def __init__(self, trusted: bool):
        self.trusted = trusted

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        out = []
        for ep, call in zip(episodes, calls, strict=True):
            if ep.env is None:
                ep.env = tau2_environment(ep.task)
            out.append(ToolTurn(ep.env.execute(call, validate=not self.trusted)))
        return out


# --------------------------------------------------------------------------- scoring


def _ran(response: JSON) -> bool:
    """Whether the call reached tau2 (not refused by our whitelist or schema check)."""
    return not (
        is_error(response) and isinstance(response["error"], dict) and response["error"].get("code") in _REFUSED
    )


def tau2_messages(episode: Episode) -> list[Any]:
    """The committed conversation as tau2 messages (see the module docstring)."""
    from tau2.data_model.message import AssistantMessage, UserMessage

    solo = bool(episode.task.extra.get("solo"))
    env = tau2_inner(episode.env)  # canonical calls and tau2's own messages, under drift too
    history = iter(env.history() if isinstance(env, Tau2Environment) else [])
    records = iter(episode.calls)
    out: list[Any] = []
    for m in episode.messages:
        if m.role == "user" and not solo:
            out.append(UserMessage(role="user", content=m.content))
        elif m.role == "assistant":
            if m.content.strip():
                out.append(AssistantMessage(role="assistant", content=m.content))
            pairs = [next(history) for _ in m.tool_calls if _ran(next(records).response)]
            if solo:  # the solo agent makes every call itself
                agent = {"requestor": "assistant"}
                pairs = [(c.model_copy(update=agent), r.model_copy(update=agent)) for c, r in pairs]
            if pairs:
                out.append(AssistantMessage(role="assistant", tool_calls=[c for c, _ in pairs]))
                out += [r for _, r in pairs]
    return out


def solo_reward(task: Task, messages: list[Any]) -> Any:
    """tau2's ``evaluate_simulation`` with ``solo_mode=True`` (otherwise as ``official_reward``)."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import Task as Tau2Task

    from envace.data.sources.tau2 import _tau2_evaluator

    evaluator = _tau2_evaluator()
    spec = {"id": task.extra["tau2_id"], "user_scenario": task.user_sim["scenario"] if task.user_sim else {},
            "initial_state": task.extra.get("initial_state"), "ticket": task.extra.get("ticket"),
            "evaluation_criteria": task.extra.get("evaluation_criteria")}  # fmt: skip
    tau2_task = Tau2Task.model_validate(spec)
    run = SimulationRun(id=f"solo-{task.id}", task_id=tau2_task.id, start_time="", end_time="", duration=0.0,
                        termination_reason=TerminationReason.AGENT_STOP, messages=messages)  # fmt: skip
    return evaluator.evaluate_simulation(simulation=run, task=tau2_task, evaluation_type=evaluator.EvaluationType.ALL,
                                         solo_mode=True, domain=task.category)  # fmt: skip


def tau2_score(episode: Episode) -> RewardOutput:
    """tau2's official reward of the committed episode; 0 when the conversation ended on a limit."""
    early = sorted(EARLY_STOP_FLAGS & episode.flags)
    if episode.user_stop == "max_user_turns":
        early.append("max_user_turns")
    if early:
        return RewardOutput(0.0, False, {"termination": MAX_STEPS, "limits": early})
    messages = tau2_messages(episode)
    task = episode.task
    info = solo_reward(task, messages) if task.extra.get("solo") else official_reward(task, messages)
    reward = float(info.reward)
    breakdown = {str(getattr(k, "value", k)): v for k, v in (info.reward_breakdown or {}).items()}
    details = {"reward": reward, "breakdown": breakdown, "user_stop": episode.user_stop}
    return RewardOutput(reward, abs(reward - 1.0) < 1e-9, details)


def pass_hat_k(successes: list[int], trials: int, k: int) -> float:
    """tau2's pass^k: the mean over tasks of ``C(c, k) / C(n, k)``.

    >>> pass_hat_k([2, 1, 0], trials=2, k=1), pass_hat_k([2, 1, 0], trials=2, k=2)
    (0.5, 0.3333333333333333)
    """
    return mean([comb(c, k) / comb(trials, k) for c in successes])


def oracle_text(episode: Episode) -> str:
    """The tau2 oracle: the gold calls (all of them, one turn: tau2's actions) at the episode's very
    first act step, then, at every later one, a reply stating the information to give."""
    gold = documented_calls(episode.task, episode.task.gold[0]) if episode.task.gold else []
    if gold and episode.turn == 0 and episode.steps_in_turn == 0:
        return render_calls("", gold)
    info = episode.task.extra.get("communicate_info") or []
    return "Here is what I found: " + "; ".join(info) if info else "Thank you for contacting us."


class Tau2Benchmark(Benchmark):
    """tau2-bench (see the module docstring).

    Args:
        filter: which tasks (``categories`` = domains; ``split`` = the official ``test`` by default).
        solo: run telecom in solo mode.
        trials: trials per task (pass^1 .. pass^trials).
        make_user: builds the user-simulator hook for a model policy, or ``None`` for scripted users.
    """

    name = "tau2"
    headline = "pass^1"

    def __init__(
        self,
        filter: TaskFilter,
        solo: bool = False,
        trials: int = 1,
        make_user: Callable[[Policy], UserHook] | None = None,
    ):
        super().__init__(filter)
        self.solo, self.trials, self.make_user = solo, trials, make_user
        self._user: UserHook | None = None

    def tasks(self) -> list[Task]:
        domains = list(self.filter.categories or DOMAINS)
        tasks = load_source("tau2", split=self.filter.split or "test", path=self.filter.path, domains=domains)
        if self.solo:
            tasks = [solo_task(t) if t.category in SOLO_DOMAINS and t.extra.get("ticket") else t for t in tasks]
        return self.filter.apply(tasks)

    def category(self, task: Task) -> str:
        return f"{task.category}-solo" if task.extra.get("solo") else task.category

    def responder(self, policy: Policy) -> Responder:
        return Tau2Executor(trusted=policy.reference)

    def user(self, policy: Policy) -> UserHook:
        if policy.reference or self.make_user is None:
            return scripted_user
        if self._user is None:
            self._user = self.make_user(policy)
        return self._user

    def oracle(self, episode: Episode) -> str:
        return oracle_text(episode)

    def score(self, episode: Episode) -> RewardOutput:
        return tau2_score(episode)

    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        rows = []
        groups = by_category(items)
        if len(groups) > 1:
            groups["[all]"] = items
        for cat, group in groups.items():
            wins: dict[str, int] = {}
            for it in group:
                wins[it.task_id] = wins.get(it.task_id, 0) + int(it.success)
            for k in range(1, self.trials + 1):
                rows.append(Summary(cat, f"pass^{k}", pass_hat_k(list(wins.values()), self.trials, k), group))
            rows.append(Summary(cat, "reward", mean([it.score or 0.0 for it in group]), group))
        return rows

    def notes(self) -> list[str]:
        lines = [f"tau2 split {self.filter.split or 'test'!r}; {self.trials} trial(s) "
                 "per task with seeds seed+trial; pass^k = mean over tasks of C(c,k)/C(n,k)."]  # fmt: skip
        if not self.solo:
            lines.append("telecom (normal mode) needs the user to act on the phone; the local simulator does not.")
        return lines


def model_user(
    config: UserSimConfig, load: Callable[[str], Policy], sampling: SamplingConfig
) -> Callable[[Policy], UserHook]:
    """A factory: ``policy -> ModelUser`` over the policy's weights or another model's."""

    def build(policy: Policy) -> ModelUser:
        user = policy if config.model == "policy" else load(config.model)
        engine = make_engine(
            user.model, user.tokenizer, user.fmt, dataclasses.replace(sampling, temperature=config.temperature)
        )
        return ModelUser(engine, user.tokenizer, config)

    return build
