"""The ``eval`` unit of an experiment: one policy on held-out tasks (BFCL multi-turn; or ShopWorld,
``evaluation.benchmark: shopworld``, scored by ``gold-writes`` instead of bfcl-eval's checker; or BFCL
single-turn AST items, ``evaluation.benchmark: bfcl-single``, the first act step judged by bfcl-eval's
``ast_checker``, each item labelled ``<split>:<category>`` so that the report reads every category apart,
and no gold-call fidelity: nothing answers its calls).

Per split (``val``: unseen scenarios of the training API classes; ``test``: unseen classes), per task:

* the official verdict of a committed episode against the real environment (bfcl-eval's
  ``multi_turn_checker``; per task and per user turn), under each private-rehearsal setting
  (:func:`envace.evaluation.evaluate`, the same code as ``envace evaluate``; a run of a seed outside
  ``evaluation.rehearsal_seeds``: setting ``none`` only);
* the rehearsal fidelity of the policy's own weights on the gold calls (the oracle acts, the policy
  writes every tool response, a real environment answers in lockstep): value and key F1, JSON
  validity, error agreement, averaged over the task's calls; once per gold layout of
  ``evaluation.gold_layouts`` (``call``: one gold call an act step, as training episodes are laid
  out; ``turn``: a turn's calls in one step), each row naming its layout;
* with private rehearsal, the fidelity of the imagination to the committed episode: each committed
  call's real response against what the latest imagination before it rehearsed for that call
  (the same tool and arguments, else the same tool), value and key F1 per item.

Under a drift of the unit (``evaluation.drift``), every task's environment is drifted
(:mod:`envace.evaluation.drift`), the gold fidelity's real answers too, and the official checker still
reads the canonical calls. The drift mitigation (``evaluation.reimagine``) runs as its own settings.
The episodes use the training config's limits (those in ``evaluation.limits`` replaced), chat format and sampling
dtype, greedy by default.

Resumable by parts (:mod:`envace.experiment.parts`): with ``parts`` (the runner's: a folder named after the
weights' fingerprint), the items of each ``evaluate`` call and the gold fidelity in each layout are written
there per chunk of ``evaluation.part_tasks`` tasks of a split as they finish, and an evaluation started again
reads the parts it finds instead of running them; parts of other weights are in other folders. A chunk is
its own ``evaluate`` call, which seeds torch afresh (``seed + trial`` per setting) at its start, and its
gold fidelity seeds each task by its place in the split: greedy (the default), the rows are those of one
call per split (up to float rounding between batch shapes, as :meth:`~envace.rollout.loop.Rollout.run` says);
sampling (``temperature > 0``), the committed episodes depend on ``part_tasks`` (reproducibly for one value).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path
from statistics import fmean
from typing import Any

from envace.data.datamodule import prompt_tokens
from envace.data.pools import spread
from envace.data.sources import SourceSpec
from envace.data.sources.bfcl import TRAIN_CLASSES
from envace.envs import DriftSpec, drifted_task
from envace.experiment.evalspec import SOURCES, EvalSpec, drift_entries, setting_label
from envace.experiment.grid import ExperimentConfig, Unit
from envace.experiment.parts import chunked_part, in_split_order
from envace.metrics.fidelity import score_pair
from envace.protocol.tokens import PieceEncoder
from envace.rollout import PolicyRehearsal, RolloutLimits, SamplingConfig, make_engine
from envace.rollout.reference import gold_rollout
from envace.types import Task

SCORES = ("value_f1", "key_f1", "json_valid", "error_agreement", "decision_f1")


def fit_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The ``model.init_args`` every fit of the grid shares (limits, tool style, chat format, sampling),
    as plain values: its base config and ``fit_args`` read as ``envace fit`` reads them, defaults included."""
    from envace.commands.fit_config import load_fit_config

    return dict(load_fit_config(["--config", cfg.base, *cfg.fit_args]).model.init_args.as_dict())


def held_out(spec: EvalSpec, split: str, tokenizer: Any, fmt: Any) -> list[Task]:
    """The split's tasks, cut to their first user turns, those whose prompt fits, spread to the cap."""
    options = {"categories": list(spec.categories)} if spec.benchmark != "shopworld" else {}
    tasks = SourceSpec(SOURCES[spec.benchmark], split, options=options).load()
    tasks = [t.first_turns(spec.max_user_turns) for t in tasks]
    if spec.max_prompt_tokens is not None:
        encoder = PieceEncoder(tokenizer)
        tasks = [t for t in tasks if prompt_tokens(t, encoder, fmt) <= spec.max_prompt_tokens]
    if spec.tasks_per_split and spec.benchmark == "shopworld":  # strata cycle in source order: a spread would
        return tasks[: spec.tasks_per_split]  # alias with the cycle, the first ones keep the shares
    return spread(tasks, spec.tasks_per_split) if spec.tasks_per_split else tasks


def eval_settings(cfg: ExperimentConfig, unit: Unit) -> tuple[DriftSpec | None, RolloutLimits, SamplingConfig, Any]:
    """``(drift, limits, sampling, loading)`` of ``unit``'s evaluation: its drift (``None``: undrifted), the
    training config's limits and sampler with the evaluation's over them, and how its policy loads."""
    from envace.evaluation.policies import PolicyConfig

    spec, model = cfg.evaluation, fit_settings(cfg)
    drift = dict(drift_entries(spec)).get(unit.drift) if unit.drift is not None else None
    limits = RolloutLimits(**{**(model["limits"] or {}), **spec.limits})
    sampling = SamplingConfig(**{**(model["sampling"] or {}), **spec.sampling, "temperature": spec.temperature})
    return drift, limits, sampling, PolicyConfig(chat_format=model["chat_format"], tool_style=model["tool_style"])


def evaluate_unit(cfg: ExperimentConfig, unit: Unit, checkpoint: Path, parts: Path | None = None) -> dict[str, Any]:
    """The result file of ``unit``: every task's official verdict per setting, and its gold fidelity in
    each of ``evaluation.gold_layouts`` (``parts``: the folder that keeps the finished parts of this
    policy's evaluation, see above)."""
    from envace.evaluation import evaluate
    from envace.evaluation.base import TaskFilter
    from envace.evaluation.drift import DriftConfig
    from envace.evaluation.policies import load_eval_policy
    from envace.inference import ImaginationConfig

    spec = cfg.evaluation
    drift, limits, sampling, loading = eval_settings(cfg, unit)
    drifting = None if drift is None else DriftConfig(list(drift.kinds), drift.mode, drift.seed)
    policy = load_eval_policy(str(checkpoint), loading)
    items: list[dict[str, Any]] = []
    fidelity: list[dict[str, Any]] = []
    for split in spec.splits:
        tasks = held_out(spec, split, policy.tokenizer, policy.fmt)  # chosen undrifted: every drift, the same tasks
        categories, ids = (list(spec.categories) if spec.benchmark != "shopworld" else None), [t.id for t in tasks]
        chosen = TaskFilter(categories=categories, split=split, task_ids=ids,
                            max_user_turns=spec.max_user_turns)  # fmt: skip
        for reimagine, n_values in evaluate_calls(spec, unit.seed):
            modes: Any = list(spec.modes)
            imagination = ImaginationConfig(n_values=n_values, modes=modes, reimagine=reimagine)
            call = {"tasks": chosen, "imagination": imagination, "limits": limits, "sampling": sampling,
                    "model": loading, "seed": unit.seed or 0, "batch_tasks": spec.batch_tasks, "drift": drifting,
                    "out": None, "quiet": True}  # fmt: skip
            name = f"{split}-items-reimagine{reimagine}-n{'-'.join(map(str, n_values))}"
            run = partial(_chunk_items, evaluate, spec, policy, split, reimagine, call, ids)
            rows = chunked_part(parts, name, ids, spec.part_tasks, run)
            items += in_split_order(rows, ids, [t.category for t in tasks])
        if spec.answers_calls:
            rehearsed = tasks if drift is None else [drifted_task(t, drift) for t in tasks]
            fidelity += split_fidelity(policy, rehearsed, limits, sampling, split, spec, parts)
    out: dict[str, Any] = {"unit": unit.key, "kind": "eval", "policy": unit.policy, "arm": unit.arm, "seed": unit.seed,
           "checkpoint": str(checkpoint), "items": items, "fidelity": fidelity}  # fmt: skip
    if unit.drift is not None:
        out.update(drift=unit.drift, drift_spec=None if drift is None else drift.to_json())
    return out


def unit_fidelity(
    cfg: ExperimentConfig, unit: Unit, checkpoint: Path, layout: str, parts: Path | None = None
) -> list[dict[str, Any]]:
    """Only the gold fidelity rows of ``unit``'s evaluation in ``layout``: the tasks, drift, limits and
    sampler :func:`evaluate_unit` uses, its parts folder too (what ``--add-fidelity`` adds to a landed unit)."""
    from envace.evaluation.policies import load_eval_policy

    spec = cfg.evaluation
    drift, limits, sampling, loading = eval_settings(cfg, unit)
    policy = load_eval_policy(str(checkpoint), loading)
    rows: list[dict[str, Any]] = []
    for split in spec.splits:
        tasks = held_out(spec, split, policy.tokenizer, policy.fmt)
        rehearsed = tasks if drift is None else [drifted_task(t, drift) for t in tasks]
        rows += split_fidelity(
            policy, rehearsed, limits, sampling, split, dataclasses.replace(spec, gold_layouts=[layout]), parts
        )
    return rows


def fidelity_part(split: str, layout: str) -> str:
    """The part (:func:`~envace.experiment.parts.kept_part`) of a split's gold fidelity in ``layout``:
    ``turn``'s keeps the name it had when it was the only layout, so that an evaluation begun then
    resumes from its parts (each chunk's name adds its place, :func:`~envace.experiment.parts.chunk_name`).

    >>> fidelity_part("test", "turn"), fidelity_part("test", "call")
    ('test-gold-fidelity', 'test-gold-fidelity-call')
    """
    return f"{split}-gold-fidelity" + ("" if layout == "turn" else f"-{layout}")


def split_fidelity(
    policy: Any,
    tasks: list[Task],
    limits: RolloutLimits,
    sampling: SamplingConfig,
    split: str,
    spec: EvalSpec,
    parts: Path | None,
) -> list[dict[str, Any]]:
    """A split's gold fidelity rows in each layout of ``spec.gold_layouts``, a part per chunk of
    ``spec.part_tasks`` tasks each (:func:`~envace.experiment.parts.chunked_part`; a chunk's seeds are
    its tasks' places in the split, so the rows do not depend on the chunking); every row names its
    layout (a part an earlier attempt wrote before rows did is ``turn``'s, by its name)."""
    ids = [t.id for t in tasks]
    rows: list[dict[str, Any]] = []
    for layout in spec.gold_layouts:

        def run(start: int, end: int, layout: str = layout) -> list[dict[str, Any]]:
            return gold_fidelity(policy, tasks[start:end], limits, sampling, split, layout, start)

        kept = chunked_part(parts, fidelity_part(split, layout), ids, spec.part_tasks, run)
        rows += [{**row, "layout": layout} for row in kept]
    return rows


def _chunk_items(
    evaluate: Callable[..., Any],
    spec: EvalSpec,
    policy: Any,
    split: str,
    reimagine: int,
    call: dict[str, Any],
    ids: list[str],
    start: int,
    end: int,
) -> list[dict[str, Any]]:
    """One ``evaluate`` call on the tasks ``ids[start:end]`` of a split (``call``'s filter cut to them),
    as the result file's item rows; each call seeds torch afresh (``seed + trial`` per setting)."""
    chunk = dataclasses.replace(call["tasks"], task_ids=ids[start:end])
    result = evaluate(spec.benchmark, policy, **{**call, "tasks": chunk})
    return [_item(spec.stratum(split, it.category), it, reimagine) for it in result.items]


def evaluate_calls(spec: EvalSpec, seed: int | None) -> list[tuple[int, list[int]]]:
    """``(reimagine, n_values)`` of each ``evaluate`` run of a policy of ``seed`` (``None``: the warm start):
    its settings (:meth:`EvalSpec.settings`; a seed outside ``rehearsal_seeds`` has ``none`` only), the
    mitigation's its own run, ``n > 0`` only.

    >>> spec = EvalSpec(n_values=[0, 2], reimagine=[0, 1], rehearsal_seeds=[0])
    >>> evaluate_calls(spec, None), evaluate_calls(spec, 0), evaluate_calls(spec, 1)
    ([(0, [0, 2]), (1, [2])], [(0, [0, 2]), (1, [2])], [(0, [0])])
    """
    ns = sorted({n for _, n, _ in spec.settings(seed)})
    calls = [(r, [n for n in ns if n > 0 or not r]) for r in spec.reimagine]
    return [(r, n_values) for r, n_values in calls if n_values]


def _item(split: str, item: Any, reimagine: int = 0) -> dict[str, Any]:
    turn = item.details.get("turn_score")
    if turn is None and item.score is not None:
        turns = item.details.get("turns") or item.turns
        turn = float(item.success) if turns <= 1 else None  # one user turn: the turn is the task
    return {"split": split, "task_id": item.task_id, "setting": setting_label(item.mode, item.n, reimagine),
            "n": item.n, "mode": item.mode, "success": bool(item.success), "score": item.score, "turn_score": turn,
            "flags": sorted(item.flags), "imagined_flags": [sorted(a.get("flags") or []) for r in item.imagination
                                                            for a in r.get("attempts", [])],
            **imagined_fidelity(item.calls, item.imagination)}  # fmt: skip


def imagined_fidelity(calls: list[dict[str, Any]], imagination: list[dict[str, Any]]) -> dict[str, Any]:
    """How well the imagination foresaw the committed episode: each committed call's real response
    against the response the latest imagination before it (``at_call`` at most its index) rehearsed
    for the same tool and arguments, else the same tool; calls it never rehearsed are left out.

    >>> call = {"call": {"name": "ls", "arguments": {}}, "response": {"files": ["a"]}}
    >>> imagined = [{"at_call": 0, "attempts": [{"calls": [{**call, "response": {"files": ["b"]}}]}]}]
    >>> imagined_fidelity([call, {**call, "call": {"name": "cd", "arguments": {}}}], imagined)
    {'imagined_pairs': 1, 'imagined_value_f1': 0.0, 'imagined_key_f1': 1.0}
    """
    scores = []
    for i, real in enumerate(calls):
        before = [r for r in imagination if r.get("at_call", 0) <= i]
        rehearsed = [c for a in (before[-1]["attempts"] if before else []) for c in a["calls"]]
        same_tool = [c for c in rehearsed if c["call"]["name"] == real["call"]["name"]]
        exact = [c for c in same_tool if c["call"]["arguments"] == real["call"]["arguments"]]
        if same_tool:
            scores.append(score_pair((exact or same_tool)[0]["response"], real["response"]))
    means = {k: (fmean(getattr(s, k) for s in scores) if scores else None) for k in ("value_f1", "key_f1")}
    return {"imagined_pairs": len(scores), "imagined_value_f1": means["value_f1"], "imagined_key_f1": means["key_f1"]}


def task_classes(spec: EvalSpec) -> dict[str, Any]:
    """The API classes of every task of ``spec``'s splits (``"<split>/<task_id>" -> classes``) and the
    classes the grid trains on: what the unseen-class table of a report groups by."""
    tasks: dict[str, list[str]] = {}
    for split in spec.splits:
        for t in SourceSpec("bfcl-multi-turn", split, options={"categories": list(spec.categories)}).load():
            tasks[f"{split}/{t.id}"] = list((t.env or {}).get("involved_classes") or [])
    return {"task_classes": tasks, "train_classes": sorted(TRAIN_CLASSES)}


def gold_fidelity(
    policy: Any,
    tasks: list[Task],
    limits: RolloutLimits,
    sampling: SamplingConfig,
    split: str,
    layout: str = "call",
    first: int = 0,
) -> list[dict[str, Any]]:
    """Per task: the mean fidelity scores of the policy's rehearsals of the gold calls (``None`` when
    the task made no call pair), the oracle laying out each turn's gold calls as ``layout`` says
    (:data:`~envace.rollout.reference.ORACLES`); task ``i`` rehearses on seed ``first + i`` (``first``:
    the place of ``tasks[0]`` in its split, so that a chunk of a split samples as the whole split does)."""
    engine = make_engine(policy.model, policy.tokenizer, policy.fmt, sampling)
    rehearsal = PolicyRehearsal(engine=engine)
    rollout = gold_rollout(policy.tokenizer, policy.fmt, engine.stop_ids, rehearsal, limits, layout=layout)
    rows = []
    for ep in rollout.run(tasks, 1, seeds=list(range(first, first + len(tasks)))):
        scores = [score_pair(p.rehearsed, p.real) for p in ep.fidelity]
        means = {k: (fmean(getattr(s, k) for s in scores) if scores else None) for k in SCORES}
        rows.append({"split": split, "task_id": ep.task.id, "layout": layout, "pairs": len(scores), **means})
    return rows
