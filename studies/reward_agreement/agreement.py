"""Agreement of the env-free BFCL multi-turn reward with bfcl-eval's official ``multi_turn_checker``.

The reward (:func:`envace.rewards.bfcl_turns.bfcl_multi_turn`) compares calls with the gold; the
official checker executes both and compares the API instances' states and the execution results
after each turn. This study harness takes episodes whose calls are the gold with one
`perturb.perturb`-ation (:data:`KINDS`: argument edits, dropped, swapped,
moved, repeated and extra calls, extra writes with other arguments before, between and after the
gold calls in every API class), picked per category and API class (:func:`select`), written by
:class:`ScriptEngine` into the ordinary rollout loop (so a real environment executes them), scores
each episode both ways (:func:`score_episode`: the reward, and the evaluation's own
:func:`~envace.evaluation.bfcl.official_verdict`) and counts the 2x2 table (:func:`confusion`). It
rolls episodes out, so it lives with the evaluation, not with the rewards (which run nothing).
``studies/reward_agreement/reward_agreement.py`` runs the measurement; ``docs/rewards.md`` explains the disagreements.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from perturb import CLASS_KINDS, KINDS, PER_CLASS, PROBES, Perturbation, Script, perturb
from perturb_calls import _valid

from envace.evaluation.bfcl import official_verdict
from envace.rewards.bfcl_effects import UNCALLED, public
from envace.rewards.bfcl_effects_table import EFFECTS
from envace.rewards.bfcl_turns import bfcl_multi_turn
from envace.rollout.engine import Request, Sample
from envace.rollout.reference import ScriptedEngine, calls_once_per_turn
from envace.types import Message, Task

#: the study's API, with the perturbation kinds it runs (defined in `perturb`)
__all__ = [
    "COUNTS",
    "KINDS",
    "PROBES",
    "Row",
    "ScriptEngine",
    "confusion",
    "run_scripted",
    "score_episode",
    "select",
    "write_classes",
]


@dataclass
class ScriptEngine(ScriptedEngine):
    """Writes each user turn's scripted calls (by task id) in one act step, then a closing text,
    as :class:`~envace.rollout.reference.OracleEngine` does with the gold.

    Args:
        scripts: ``task id -> calls per user turn``; tasks of one rollout must be distinct.
    """

    scripts: dict[str, Script] = field(default_factory=dict)

    def text_for(self, episode: Any) -> str:
        script = self.scripts[episode.task.id]
        return calls_once_per_turn(episode, script[episode.turn] if episode.turn < len(script) else [])

    def write(self, requests: list[Request]) -> list[Sample]:
        samples = super().write(requests)
        for r, s in zip(requests, samples, strict=True):
            if len(s.ids) >= r.max_new_tokens:  # the base class would cut the script short
                raise ValueError(f"a scripted turn does not fit in max_new_tokens={r.max_new_tokens}")
        return samples


@dataclass
class Row:
    """One episode scored both ways."""

    task_id: str
    category: str
    source: str
    kind: str
    note: str
    ours: bool
    official: bool
    turns: list[bool]
    error_type: str | None = None
    error_message: str | None = None
    n_calls: int = 0
    api_class: str = ""
    failures: list[str] = field(default_factory=list)
    #: for an added call: "refused" when the API answered it with an error, else "applied"
    added: str = ""

    @property
    def agree(self) -> bool:
        return self.ours == self.official


def score_episode(episode: Any, source: str, kind: str = "", note: str = "", p: Perturbation | None = None) -> Row:
    """Our strict flag and the official verdict for one finished rollout episode (``p``: the
    perturbation it was scripted from, for the API class and the fate of an added call)."""
    ours = bfcl_multi_turn(episode.task, episode.trajectory())
    verdict = official_verdict(episode.task, episode.messages, episode.flags)
    added = "" if p is None or p.added is None else _fate(episode.messages, *p.added)
    return Row(
        episode.task.id,
        episode.task.category,
        source,
        kind,
        note,
        ours.success,
        verdict["valid"],
        list(ours.details.get("turns", [])),
        verdict.get("error_type"),
        verdict.get("error_message"),
        len(episode.calls),
        "" if p is None else p.api_class,
        list(ours.details.get("failures", [])),
        added,
    )


def _fate(messages: list[Message], turn: int, index: int) -> str:
    """ "refused" when the ``index``-th call of user turn ``turn``'s act step got an error response."""
    turns = [n for n, m in enumerate(messages) if m.role == "user"]
    after = messages[turns[turn] + 1 :]
    act = next(n for n, m in enumerate(after) if m.role == "assistant" and m.tool_calls)
    result = [m for m in after[act + 1 :] if m.role == "tool"][index]
    try:
        body = json.loads(result.content)
    except json.JSONDecodeError:
        return "applied"
    return "refused" if isinstance(body, dict) and "error" in body else "applied"


#: per kind: episodes, agreements, ours pass, official pass, ours only (a false positive: ours pass,
#: official fail), official only (ours fail, official pass)
COUNTS = ("n", "agree", "ours", "official", "ours_only", "official_only")


def _counts(rows: list[Row], key: Any) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        k = out.setdefault(key(r), dict.fromkeys(COUNTS, 0))
        values = (1, r.agree, r.ours, r.official, r.ours and not r.official, r.official and not r.ours)
        for name, value in zip(COUNTS, values, strict=True):
            k[name] += int(value)
    return out


def confusion(rows: list[Row]) -> dict[str, Any]:
    """The 2x2 table (ours x official), agreement, Cohen's kappa, and the counts per kind and, for the
    :data:`PER_CLASS` kinds, per API class and per fate of the added call (applied or refused by the API).

    >>> r = lambda o, f: Row("t", "c", "s", "k", "", o, f, [])
    >>> c = confusion([r(True, True), r(False, False), r(False, False), r(True, False)])
    >>> c["matrix"]["ours_pass"], c["matrix"]["ours_fail"], c["agreement"], round(c["kappa"], 3)
    ({'official_pass': 1, 'official_fail': 1}, {'official_pass': 0, 'official_fail': 2}, 0.75, 0.5)
    >>> c["by_kind"]["s/k"]["ours_only"], c["by_kind"]["s/k"]["official_only"]
    (1, 0)
    """
    n = len(rows)
    cell = {(o, f): sum(r.ours == o and r.official == f for r in rows) for o in (True, False) for f in (True, False)}
    matrix = {
        f"ours_{'pass' if o else 'fail'}": {"official_pass": cell[o, True], "official_fail": cell[o, False]}
        for o in (True, False)
    }
    agree = (cell[True, True] + cell[False, False]) / n if n else 0.0
    p_ours, p_off = sum(r.ours for r in rows) / max(n, 1), sum(r.official for r in rows) / max(n, 1)
    chance = p_ours * p_off + (1 - p_ours) * (1 - p_off)
    kappa = (agree - chance) / (1 - chance) if chance < 1 else 1.0
    by_kind = _counts(rows, lambda r: f"{r.source}/{r.kind}" if r.kind else r.source)
    by_class = _counts([r for r in rows if r.api_class and r.kind not in CLASS_KINDS], lambda r: r.api_class)
    per_class = [r for r in rows if r.api_class and r.kind in CLASS_KINDS]
    by_kind_class = _counts(per_class, lambda r: f"{r.kind}/{r.api_class}")
    by_fate = _counts([r for r in rows if r.added], lambda r: r.added)
    return {"n": n, "matrix": matrix, "agreement": agree, "kappa": kappa, "by_kind": by_kind, "by_class": by_class,
            "by_fate": by_fate, "by_kind_class": by_kind_class}  # fmt: skip


def write_classes() -> list[str]:
    """The API classes with a tool that changes compared state (the :data:`PER_CLASS` strata)."""
    return sorted(c for c, tools in EFFECTS.items() if any(public(a) for _, w in tools.values() for a in w))


def _classes(kind: str) -> list[str]:
    """The API classes a kind is drawn per: those with writes for :data:`PER_CLASS`, every class for
    `perturb_class.CLASS_KINDS`, none (``[""]``) for the rest."""
    if kind in CLASS_KINDS:
        return sorted(set(EFFECTS) | set(UNCALLED))
    return write_classes() if kind in PER_CLASS else [""]


def select(
    tasks: list[Task], kinds: tuple[str, ...], per_category: int, seed: int = 0
) -> list[tuple[Task, Perturbation]]:
    """``per_category`` episodes of each kind in each category (of each :data:`PER_CLASS` kind, that
    many per API class of :func:`write_classes`), each on a different task within its kind.

    Tasks are drawn in a seeded order per (category, kind, class), skipping those whose gold breaks
    its own tool schemas (the rollout would reject the unperturbed gold) and those a kind does not
    apply to. One task may serve several kinds (:func:`run_scripted` rolls them out in rounds).
    """
    by_category: dict[str, list[Task]] = {}
    for task in tasks:
        if all(_valid(task, t, c) for t, calls in enumerate(task.gold) for c in calls):
            by_category.setdefault(task.category, []).append(task)
    items = []
    for category in sorted(by_category):
        for kind in kinds:
            for api_class in _classes(kind):
                pool = list(by_category[category])
                random.Random(f"{seed}:{category}:{kind}:{api_class}").shuffle(pool)
                taken = 0
                while pool and taken < per_category:
                    task = pool.pop()
                    found = perturb(task, kind, random.Random(f"{seed}:{task.id}:{kind}:{api_class}"), api_class)
                    if found is not None:
                        items.append((task, found))
                        taken += 1
    return items


def _rounds(items: list[tuple[Task, Perturbation]]) -> list[list[int]]:
    """The items split into rounds in which no task appears twice (a scripted engine keys by task id)."""
    rounds: list[tuple[list[int], set[str]]] = []
    for n, (task, _) in enumerate(items):
        free = next((r for r in rounds if task.id not in r[1]), None)
        if free is None:
            free = ([], set())
            rounds.append(free)
        free[0].append(n)
        free[1].add(task.id)
    return [r for r, _ in rounds]


def run_scripted(items: list[tuple[Task, Perturbation]], tokenizer: Any, fmt: Any) -> list[Row]:
    """Roll each scripted episode out against its real environment and score it both ways; rows in
    the order of ``items``."""
    from envace.rollout import RealEnvironment, RolloutLimits, make_rollout, stop_ids

    limits = RolloutLimits(max_calls_per_step=64, max_new_tokens=8192, max_episode_tokens=10**7)  # never cut a script
    rows: dict[int, Row] = {}
    for batch in _rounds(items):
        chosen = [items[n] for n in batch]
        engine = ScriptEngine(tokenizer, stop_ids(tokenizer, fmt), scripts={t.id: p.script for t, p in chosen})
        episodes = make_rollout(engine, tokenizer, fmt, RealEnvironment(), limits).run([t for t, _ in chosen])
        for n, ep, (_, p) in zip(batch, episodes, chosen, strict=True):
            rows[n] = score_episode(ep, "scripted", p.kind, p.note, p)
    return [rows[n] for n in range(len(items))]
