"""BFCL-v4 memory categories (``memory_kv``, ``memory_rec_sum``) as bfcl-eval runs and scores them.

bfcl-eval's pipeline (``utils.process_memory_test_case``, ``base_handler.inference_multi_turn_*``,
``eval_runner._evaluate_single_agentic_entry``), reproduced with its data, backends and checker:

1. **Prerequisites.** Each of the 5 scenarios (student, customer, finance, healthcare, notetaker)
   has a chain of prerequisite conversations (``memory_prereq_conversation/memory_<scenario>.json``,
   37 in all). Conversation k starts from the memory its scenario had after conversation k-1 (the
   first from empty), shown in its system prompt (``MEMORY_BACKEND_INSTRUCTION_*`` with the
   backend's ``_dump_core_memory_to_context()``); the policy may write memory with the backend's
   tools; at the end the backend writes its snapshot file (``_flush_memory_to_local_file``). These
   conversations are not scored. Chains run in waves: conversation k of every scenario together.
2. **Questions.** Each of the 155 questions starts a fresh backend from its scenario's final
   snapshot, with the memory prompt and ``ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT`` as
   its system prompt; one user turn, several steps (the policy may read memory); whatever it writes
   to memory is not kept.
3. **Score.** ``agentic_checker`` on the last assistant message without calls: one of the possible
   answers must appear in it (case, spaces and ``,./-_*^()`` ignored). No such message (a call at
   every step, or a step/token limit) fails, as ``agentic:no_last_message``.

Snapshots live in a temporary folder per evaluation setting and trial (the backends' own file
layout), so settings never share memory. The oracle writes each question's gold answer into memory
during the prerequisite conversation where its ``source`` quote appears (else in the last one), and
at the question reads it back and answers with what it read, so 100 % means the snapshots chain.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from envace._bfcl import bfcl_data_dir, bfcl_module
from envace.data.sources.bfcl import read_jsonl, user_text
from envace.envs.bfcl import load_instance
from envace.protocol import render_calls
from envace.rewards.base import RewardOutput
from envace.rollout import Episode
from envace.rollout.reference import calls_once_per_turn, gold_calls
from envace.types import Task, ToolCall, ToolSchema

MEMORY_CATEGORIES = ("memory_kv", "memory_rec_sum")
BACKENDS = {"memory_kv": "MemoryAPI_kv", "memory_rec_sum": "MemoryAPI_rec_sum"}


def _root(path: str | None) -> Path:
    return Path(path) if path else bfcl_data_dir()


def _docs(root: Path, backend: str) -> list[ToolSchema]:
    mapping = bfcl_module("constants.executable_backend_config").MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return [rec for _, rec in read_jsonl(root / "multi_turn_func_doc" / mapping[backend])]


def _env(category: str, backend: str, task_id: str, scenario: str) -> dict[str, Any]:
    """bfcl-eval's ``populate_initial_settings_for_memory_test_cases`` (the folder is set per run)."""
    test_category = f"{category}_prereq" if "prereq" in task_id else category
    config = {"model_result_dir": "", "scenario": scenario, "test_id": task_id, "test_category": test_category}
    return {"kind": "bfcl", "initial_config": {backend: config}, "involved_classes": [backend], "id": task_id}


def memory_key(question_id: str) -> str:
    """The oracle's memory key of a question: its scenario and index (a valid snake_case key).

    >>> memory_key("memory_kv_3-customer-3")
    'customer_3'
    """
    _, scenario, index = question_id.rsplit("-", 2)
    return f"{scenario}_{index}"


def load_questions(categories: list[str], path: str | None = None) -> list[Task]:
    """The 155 questions of each memory category (``BFCL_v4_memory.json``), ids as bfcl-eval renames them."""
    root = _root(path)
    answers = {rec["id"]: rec for _, rec in read_jsonl(root / "possible_answer" / "BFCL_v4_memory.json")}
    tasks = []
    for category in categories:
        backend = BACKENDS[category]
        docs = _docs(root, backend)
        for _, rec in read_jsonl(root / "BFCL_v4_memory.json"):
            answer = answers[rec["id"]]
            task_id = rec["id"].replace("memory", category)
            tasks.append(
                Task(
                    id=task_id,
                    benchmark="bfcl",
                    category=category,
                    tools=docs,
                    user_turns=[user_text(turn) for turn in rec["question"]],
                    env=_env(category, backend, task_id, rec["scenario"]),
                    extra={
                        "ground_truth": answer["ground_truth"],
                        "source": answer.get("source", ""),
                        "scenario": rec["scenario"],
                        "memory_key": memory_key(rec["id"]),
                    },
                )
            )
    return tasks


# --------------------------------------------------------------------------- the oracle's writes


def _norm(text: str) -> str:
    return " ".join(text.replace("\u2019", "'").replace("\u2018", "'").lower().split())


def _fragments(source: str) -> list[str]:
    """The quoted pieces of a possible answer's ``source`` (split at ellipses, quotes stripped)."""
    parts = re.split(r"\.\.\.|\u2026", source)
    return [f for f in (_norm(p).strip(" \"'") for p in parts) if len(f) >= 8]


def write_call(category: str, key: str, answer: str) -> ToolCall:
    """The oracle's memory write of one answer: an archival entry (kv) or a line of the memory (rec_sum)."""
    if category == "memory_kv":
        return ToolCall("archival_memory_add", {"key": key, "value": answer})
    return ToolCall("memory_append", {"text": f"{key}: {answer}\n"})


def read_call(category: str, key: str) -> ToolCall:
    """The oracle's memory read at a question."""
    if category == "memory_kv":
        return ToolCall("archival_memory_retrieve", {"key": key})
    return ToolCall("memory_retrieve", {})


def recalled(response: Any, key: str) -> str | None:
    """The answer the oracle wrote under ``key``, read from a retrieve response (``None``: not there).

    >>> recalled({"value": "Michael"}, "customer_0"), recalled({"memory_content": "a_1: x\\na_2: y\\n"}, "a_2")
    ('Michael', 'y')
    """
    if not isinstance(response, dict):
        return None
    if isinstance(response.get("value"), str):
        return str(response["value"])
    found = re.search(rf"^{re.escape(key)}: (.*)$", str(response.get("memory_content", "")), re.MULTILINE)
    return found.group(1) if found else None


def prerequisites(category: str, scenario: str, questions: list[Task], path: str | None = None) -> list[Task]:
    """The scenario's chain of prerequisite conversations, in order; their ``gold`` holds the oracle's
    writes: each question's first possible answer, in the turn that quotes its ``source`` (else the
    last turn of the last conversation)."""
    root = _root(path)
    backend = BACKENDS[category]
    docs = _docs(root, backend)
    chain = []
    for _, rec in read_jsonl(root / "memory_prereq_conversation" / f"memory_{scenario}.json"):
        task_id = rec["id"].replace("memory", category)
        turns = [user_text(turn) for turn in rec["question"]]
        chain.append(
            Task(
                id=task_id,
                benchmark="bfcl",
                category=f"{category}_prereq",
                tools=docs,
                user_turns=turns,
                gold=[[] for _ in turns],
                env=_env(category, backend, task_id, scenario),
                extra={"scenario": scenario, "topic": rec.get("topic", "")},
            )
        )
    texts = [(k, i, _norm(text)) for k, task in enumerate(chain) for i, text in enumerate(task.user_turns)]
    for q in (q for q in questions if q.extra["scenario"] == scenario):
        frags = _fragments(q.extra["source"])
        k, i = next(((k, i) for k, i, text in texts if any(f in text for f in frags)), (-1, -1))
        call = write_call(category, q.extra["memory_key"], str(q.extra["ground_truth"][0]))
        chain[k].gold[i].append(call)
    return chain


# --------------------------------------------------------------------------- the two phases


def system_prompt(task: Task) -> str:
    """bfcl-eval's system prompt of a memory entry (``add_memory_instruction_system_prompt``): the
    scenario, the backend's instructions and its memory as its snapshot holds it now; questions also
    get ``ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT`` after a blank line."""
    prompts = bfcl_module("constants.default_prompts")
    env = task.env or {}
    backend = env["involved_classes"][0]
    memory = load_instance(backend, env["initial_config"])._dump_core_memory_to_context()
    name = "UNIFIED" if "rec_sum" in task.category else "CORE_ARCHIVAL"
    template = getattr(prompts, f"MEMORY_BACKEND_INSTRUCTION_{name}")
    setting = prompts.MEMORY_AGENT_SETTINGS[task.extra["scenario"]]
    text = str(template.format(scenario_setting=setting, memory_content=memory))
    if "prereq" not in task.id:
        text += "\n\n" + prompts.ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT
    return text


def _ready(task: Task, folder: Path) -> Task:
    """``task`` with its snapshot folder set and its system prompt read from the snapshot there."""
    env = dict(task.env or {})
    config = {c: {**v, "model_result_dir": str(folder)} for c, v in env["initial_config"].items()}
    task = dataclasses.replace(task, env={**env, "initial_config": config})
    return dataclasses.replace(task, system_prompt=system_prompt(task))


@contextmanager
def memory_phase(
    category: str, questions: list[Task], run: Callable[[list[Task]], list[Episode]], path: str | None = None
) -> Iterator[list[Task]]:
    """Run the prerequisite chains of the questions' scenarios with ``run`` (unscored; wave k is
    conversation k of every scenario) in a fresh snapshot folder, then yield the questions ready to
    run from the final snapshots. The folder is removed on exit."""
    scenarios = list(dict.fromkeys(q.extra["scenario"] for q in questions))
    every = load_questions([category], path)  # the oracle writes every answer of the scenario
    chains = [prerequisites(category, s, every, path) for s in scenarios]
    with tempfile.TemporaryDirectory(prefix=f"envace-bfcl-{category}-") as tmp:
        folder = Path(tmp)
        for k in range(max((len(c) for c in chains), default=0)):
            run([_ready(chain[k], folder) for chain in chains if k < len(chain)])
        yield [_ready(q, folder) for q in questions]


# --------------------------------------------------------------------------- oracle and score


def oracle_text(episode: Episode) -> str:
    """The oracle at a memory entry: prerequisites write their gold; a question reads its key back,
    then answers with what it read in bfcl-eval's answer format."""
    task = episode.task
    if "prereq" in task.id:
        return calls_once_per_turn(episode, gold_calls(episode))
    key = task.extra["memory_key"]
    if episode.steps_in_turn == 0:
        return render_calls("", [read_call(task.category, key)])
    answer = recalled(episode.calls[-1].response if episode.calls else None, key)
    if answer is None:
        return "{'answer': 'I do not know', 'context': 'I do not know'}"
    return f"{{'answer': '{answer}', 'context': 'recalled from memory ({key})'}}"


def final_answer(episode: Episode) -> str | None:
    """The last assistant message without calls (bfcl-eval's last message that is not a function call)."""
    texts = [m.content for m in episode.messages if m.role == "assistant" and not m.tool_calls]
    return texts[-1] if texts else None


def score_memory(episode: Episode) -> RewardOutput:
    """bfcl-eval's ``agentic_checker`` on the episode's final answer."""
    answer = final_answer(episode)
    base = {"n_calls": len(episode.calls), "answer": answer}
    if answer is None:
        why = f"no message without a call (flags {sorted(episode.flags)})"
        return RewardOutput(0.0, False, {**base, "error_type": "agentic:no_last_message", "error": why})
    checker = bfcl_module("eval_checker.agentic_eval.agentic_checker")
    verdict = checker.agentic_checker(answer, list(episode.task.extra["ground_truth"]))
    ok = bool(verdict.get("valid"))
    return RewardOutput(float(ok), ok, {**base, "error_type": verdict.get("error_type")})
