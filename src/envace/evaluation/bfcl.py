"""BFCL-v4 with bfcl-eval's own checkers and its own Overall aggregation, offline.

* single-turn categories: the policy's first act step is the answer (one step, as BFCL's FC mode);
  ``ast_checker`` through :func:`envace.rewards.bfcl.bfcl_single_turn`; irrelevance categories
  pass with no call, ``live_relevance`` with any call;
* multi-turn categories: the committed episode runs against the real API classes
  (:class:`~envace.envs.bfcl.BFCLEnvironment`); its calls per turn and step become call strings
  rebuilt from validated values and go to ``multi_turn_checker`` (a unique model name; its
  module-global instances are deleted afterwards). As in bfcl-eval's runner, an episode that did
  not reach every turn, or hit the step limit, is force-terminated and fails;
* memory categories (``memory_kv``, ``memory_rec_sum``): bfcl-eval's two phases, unscored
  prerequisite conversations that write memory snapshots, then the questions, scored by
  ``agentic_checker`` on the final answer (:mod:`envace.evaluation.bfcl_memory`);
* Overall: bfcl-eval's ``calculate_*`` functions with its weights 10/10/10/30/40 over non-live,
  live, irrelevance, multi-turn and agentic. Web search and ``memory_vector`` do not run here, so
  the Overall is **partial**: missing categories count 0, as in bfcl-eval; ``overall_evaluated``
  re-normalises the weights over the groups and categories that ran.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import cache
from typing import Any

from envace._bfcl import bfcl_data_dir, bfcl_module, run_multi_turn_checker
from envace.data.sources import load_source
from envace.data.sources.bfcl import MULTI_TURN_CATEGORIES, SINGLE_TURN_CATEGORIES, call_string
from envace.data.sources.bfcl_reference import reference_calls
from envace.envs import canonical_messages, canonical_task
from envace.evaluation.base import Benchmark, ItemResult, Summary, by_category, mean
from envace.evaluation.bfcl_memory import MEMORY_CATEGORIES, load_questions, memory_phase, oracle_text, score_memory
from envace.evaluation.policies import Policy
from envace.rewards import LIMIT_FAILS, compute_reward
from envace.rewards.base import RewardOutput
from envace.rewards.bfcl import _checker_docs
from envace.rollout import Episode, RealEnvironment, RolloutLimits
from envace.rollout.reference import calls_once_per_turn
from envace.rollout.responders import Responder, ToolTurn
from envace.types import Message, Task, ToolCall

OFFLINE_CATEGORIES = SINGLE_TURN_CATEGORIES + MULTI_TURN_CATEGORIES + MEMORY_CATEGORIES
NON_LIVE_AST = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
AGENTIC = ("web_search_base", "web_search_no_snippet", "memory_kv", "memory_vector", "memory_rec_sum")
WEIGHTS = (10, 10, 10, 30, 40)  # non-live, live, irrelevance, multi-turn, agentic (eval_runner_helper)
MISSING = {
    "web_search_base": "needs the live web (bfcl-eval's WebSearchAPI queries a search engine)",
    "web_search_no_snippet": "needs the live web",
    "memory_vector": "needs sentence-embedding weights (all-MiniLM-L6-v2) for its vector store",
    "format_sensitivity": "not part of the Overall (a robustness study over prompt formats)",
}


class TrustedEnvironment(RealEnvironment):
    """The real environment for reference policies: gold runs as the official harness runs it
    (no argument-schema or turn-visibility check; dispatch stays whitelisted)."""

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        out = []
        for ep, call in zip(episodes, calls, strict=True):
            out.append(ToolTurn(ep.env.execute(call, validate=False) if ep.env is not None else ep.execute_real(call)))
        return out


# --------------------------------------------------------------------------- multi-turn checker


def steps_per_turn(messages: list[Message]) -> list[list[list[ToolCall]]]:
    """The calls of each act step, per user turn (steps without calls left out).

    >>> ms = [Message("user", "a"), Message("assistant", tool_calls=[ToolCall("f")]), Message("assistant", "ok"),
    ...       Message("user", "b")]
    >>> [[[c.name for c in s] for s in t] for t in steps_per_turn(ms)]
    [[['f']], []]
    """
    turns: list[list[list[ToolCall]]] = []
    for m in messages:
        if m.role == "user":
            turns.append([])
        elif m.role == "assistant" and m.tool_calls and turns:
            turns[-1].append(list(m.tool_calls))
    return turns


def decoded_steps(messages: list[Message]) -> list[list[list[str]]]:
    """The committed calls as ``multi_turn_checker`` reads them: per user turn, per act step with
    calls, the call strings rebuilt from the validated calls (steps without calls left out, as
    bfcl-eval's runner drops empty decodes).

    >>> decoded_steps([Message("user", "a"), Message("assistant", tool_calls=[ToolCall("cd", {"folder": "x"})]),
    ...                Message("assistant", "ok"), Message("user", "b")])
    [[["cd(folder='x')"]], []]
    """
    return [[[call_string(c) for c in step] for step in turn] for turn in steps_per_turn(messages)]


def official_verdict(task: Task, messages: list[Message], flags: Collection[str] = frozenset()) -> dict[str, Any]:
    """bfcl-eval's verdict on the committed calls of ``messages``: ``{"valid", "error_type", "error_message"}``.

    As bfcl-eval's runner, an episode that did not reach every turn, or hit the step limit, is
    force-terminated and fails; else ``multi_turn_checker`` runs on :func:`decoded_steps` under a
    fresh model name, and its module-global API instances are deleted afterwards. A drifted task is
    scored as the benchmark knows it (:func:`~envace.envs.canonical_task`), on the calls that ran,
    under their canonical names (:func:`~envace.envs.canonical_messages`; docs/drift.md).
    """
    messages, task = canonical_messages(task, messages), canonical_task(task)
    reached, gold = len(steps_per_turn(messages)), task.extra["ground_truth"]
    if reached < len(gold) or LIMIT_FAILS["bfcl-multi-turn"] & set(flags):
        why = f"force-terminated: {reached} of {len(gold)} turns, flags {sorted(flags)}"
        return {"valid": False, "error_type": "multi_turn:force_terminated", "error_message": why}
    try:
        decoded = decoded_steps(messages)
    except ValueError as exc:  # not reachable for validated calls: names and keys are schema identifiers
        return {"valid": False, "error_type": "envace:unrenderable_call", "error_message": str(exc)}
    result = run_multi_turn_checker(task, decoded[: len(gold)], gold)
    return {"valid": bool(result.get("valid")), "error_type": result.get("error_type"),
            "error_message": result.get("error_message")}  # fmt: skip


def official_multi_turn(task: Task, episode: Episode) -> RewardOutput:
    """bfcl-eval's ``multi_turn_checker`` verdict on the committed episode (:func:`official_verdict`)."""
    verdict = official_verdict(task, episode.messages, episode.flags)
    details = {"n_calls": len(episode.calls), "turns_reached": len(steps_per_turn(episode.messages)),
               "error_type": verdict["error_type"], "error": verdict["error_message"]}  # fmt: skip
    return RewardOutput(float(verdict["valid"]), verdict["valid"], details)


# --------------------------------------------------------------------------- aggregation


@cache
def dataset_size(category: str) -> int:
    """Items in a category's data file (bfcl-eval counts a category that did not run with its size)."""
    file = bfcl_data_dir() / f"BFCL_v4_{category}.json"
    if category in MEMORY_CATEGORIES:
        file = bfcl_data_dir() / "BFCL_v4_memory.json"
    elif category in AGENTIC or not file.is_file():
        return 0
    with file.open(encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


def _acc(scores: dict[str, tuple[float, int]], category: str) -> dict[str, Any]:
    """bfcl-eval's per-category score dict; a category that did not run is N/A and counts 0."""
    if category in scores:
        acc, count = scores[category]
        return {"accuracy": acc, "total_count": count, "display_accuracy": acc}
    return {"accuracy": 0.0, "total_count": dataset_size(category), "display_accuracy": "N/A"}


def overall(scores: dict[str, tuple[float, int]], evaluated_only: bool = False) -> dict[str, float]:
    """BFCL-v4 group scores and Overall from per-category ``(accuracy, count)``, with bfcl-eval's
    own aggregation functions (``eval_runner_helper``): as its leaderboard, a category that did not
    run counts 0; ``evaluated_only`` instead leaves out categories and groups that did not run
    (weights re-normalised over the groups that remain).
    """
    h = bfcl_module("eval_checker.eval_runner_helper")
    acc = {c: _acc(scores, c) for c in (*OFFLINE_CATEGORIES, *AGENTIC)}

    def group(fn: Any, parts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
        kept = [p for p in parts if p is not None and not (evaluated_only and p["display_accuracy"] == "N/A")]
        if not kept or (fn is h.calculate_weighted_accuracy and not sum(p["total_count"] for p in kept)):
            return None
        result: dict[str, Any] = fn(kept, display_na_if_category_missing=False)
        return result

    unweighted, weighted = h.calculate_unweighted_accuracy, h.calculate_weighted_accuracy
    simple = group(unweighted, [acc["simple_python"], acc["simple_java"], acc["simple_javascript"]])
    web = group(unweighted, [acc["web_search_base"], acc["web_search_no_snippet"]])
    memory = group(unweighted, [acc["memory_kv"], acc["memory_vector"], acc["memory_rec_sum"]])
    groups = {
        "non_live": group(unweighted, [simple, acc["multiple"], acc["parallel"], acc["parallel_multiple"]]),
        "live": group(weighted, [acc[c] for c in LIVE_AST]),
        "irrelevance": group(unweighted, [acc["irrelevance"], acc["live_irrelevance"]]),
        "multi_turn": group(unweighted, [acc[c] for c in MULTI_TURN_CATEGORIES]),
        "agentic": group(unweighted, [web, memory]),
    }
    present = [(g, w) for g, w in zip(groups.values(), WEIGHTS, strict=True) if g is not None]
    out = {name: float(g["accuracy"]) for name, g in groups.items() if g is not None}
    if present:
        total = h.calculate_percentage_weighted_accuracy(
            [g for g, _ in present], [w for _, w in present], display_na_if_category_missing=False
        )
        out["overall"] = float(total["accuracy"])
    return out


class BFCLBenchmark(Benchmark):
    """BFCL-v4, every category that runs offline (see the module docstring)."""

    name = "bfcl"
    headline = "accuracy"

    def tasks(self) -> list[Task]:
        cats = list(self.filter.categories or OFFLINE_CATEGORIES)
        unknown = [c for c in cats if c not in OFFLINE_CATEGORIES]
        if unknown:
            why = "; ".join(f"{c}: {MISSING.get(c, 'unknown category')}" for c in unknown)
            raise ValueError(f"BFCL categories that do not run offline: {why}")
        single = [c for c in cats if c in SINGLE_TURN_CATEGORIES]
        multi = [c for c in cats if c in MULTI_TURN_CATEGORIES]
        memory = [c for c in cats if c in MEMORY_CATEGORIES]
        tasks: list[Task] = []
        path = self.filter.path
        split = self.filter.split or "all"
        if single:  # train/test: the declared split by called function (envace.data.sources.bfcl_single)
            tasks += load_source("bfcl-single-turn", split=split, path=path, categories=single)
        if multi:
            tasks += load_source("bfcl-multi-turn", split=split, path=path, categories=multi)
        if memory:
            tasks += load_questions(memory, path)
        order = {c: i for i, c in enumerate(cats)}
        tasks.sort(key=lambda t: order[t.category])  # stable: the source's order within a category
        return self.filter.apply(tasks)

    def limits(self, category: str, limits: RolloutLimits) -> RolloutLimits:
        if category in SINGLE_TURN_CATEGORIES:  # the first response is the answer
            return replace(limits, max_steps_per_turn=1)
        return limits

    @contextmanager
    def prepared(
        self, category: str, tasks: list[Task], run: Callable[[list[Task]], list[Episode]]
    ) -> Iterator[list[Task]]:
        """Memory categories: the prerequisite conversations run first (their snapshots, in a folder
        removed afterwards, are what the questions start from)."""
        if category not in MEMORY_CATEGORIES:
            yield tasks
            return
        with memory_phase(category, tasks, run, self.filter.path) as ready:
            yield ready

    def responder(self, policy: Policy) -> Responder:
        return TrustedEnvironment() if policy.reference else RealEnvironment()

    def oracle(self, episode: Episode) -> str:
        if episode.task.category.startswith("memory_"):  # questions and their prerequisites
            return oracle_text(episode)
        task = episode.task
        if task.category in SINGLE_TURN_CATEGORIES:  # calls written as the checker expects them
            docs = _checker_docs(task, str(task.extra.get("language", "python")))
            return calls_once_per_turn(episode, reference_calls(task, docs))
        return super().oracle(episode)

    def score(self, episode: Episode) -> RewardOutput:
        if episode.task.category in MULTI_TURN_CATEGORIES:
            return official_multi_turn(episode.task, episode)
        if episode.task.category in MEMORY_CATEGORIES:
            return score_memory(episode)
        return compute_reward(episode.task, episode.trajectory())

    def summarize(self, items: list[ItemResult]) -> list[Summary]:
        rows = []
        scores: dict[str, tuple[float, int]] = {}
        for cat, group in by_category(items).items():
            acc = mean([float(it.success) for it in group])
            scores[cat] = (acc, len(group))
            rows.append(Summary(cat, "accuracy", acc, group))
        official, evaluated = overall(scores), overall(scores, evaluated_only=True)
        for name, value in official.items():
            members = items if name == "overall" else [it for it in items if _group_of(it.category) == name]
            if members:
                rows.append(
                    Summary("[overall_partial]" if name == "overall" else f"[{name}]", "accuracy", value, members)
                )
        if "overall" in evaluated:
            rows.append(Summary("[overall_evaluated]", "accuracy", evaluated["overall"], items))
        return rows

    def notes(self) -> list[str]:
        ran = set(self.filter.categories or OFFLINE_CATEGORIES)
        not_run = [c for c in dict.fromkeys((*OFFLINE_CATEGORIES, *AGENTIC)) if c not in ran]  # memory is in both
        lines = ["BFCL Overall is PARTIAL: weights 10/10/10/30/40 (non-live, live, irrelevance, multi-turn, agentic) "
                 "as bfcl-eval; categories that did not run count 0 in [overall_partial] and are left out of "
                 "[overall_evaluated] (weights re-normalised)."]  # fmt: skip
        lines += [f"missing {c}: {MISSING[c]}" for c in AGENTIC if c in MISSING]
        if ran & set(MEMORY_CATEGORIES):
            lines.append("memory: the prerequisite conversations of each scenario ran first (not scored, not in "
                         "the table), writing the memory snapshots the questions start from")  # fmt: skip
        skipped = [c for c in not_run if c in OFFLINE_CATEGORIES]
        if skipped:
            lines.append(f"not selected in this run (count 0 in [overall_partial]): {', '.join(skipped)}")
        subset = [f"{k}={v}" for k, v in (("limit", self.filter.limit), ("task_ids", self.filter.task_ids),
                                          ("max_user_turns", self.filter.max_user_turns)) if v is not None]  # fmt: skip
        if subset:
            lines.append("subset: " + ", ".join(subset))
        return lines


def _group_of(category: str) -> str:
    if category in NON_LIVE_AST:
        return "non_live"
    if category in LIVE_AST:
        return "live"
    if category in ("irrelevance", "live_irrelevance"):
        return "irrelevance"
    if category in MULTI_TURN_CATEGORIES:
        return "multi_turn"
    if category in AGENTIC:
        return "agentic"
    return "other"  # live_relevance is reported but not in the Overall
