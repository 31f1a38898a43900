"""How an experiment evaluates every policy (``evaluation:`` of its config): the splits, the tasks,
the private-rehearsal settings, the drifts of the real environment, and their labels.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from envace.envs import DriftSpec
from envace.evaluation.bfcl_single import SPLIT_CATEGORIES
from envace.rollout.engine.sampling import SamplingConfig
from envace.rollout.loop import RolloutLimits
from envace.rollout.reference import ORACLES

NO_DRIFT = "none"
#: the source of each benchmark an experiment can evaluate
SOURCES = {"bfcl": "bfcl-multi-turn", "bfcl-single": "bfcl-single-turn", "shopworld": "shopworld"}
#: the benchmarks whose items the report reads per category (``<split>:<category>``, :meth:`EvalSpec.stratum`)
BY_CATEGORY = ("bfcl-single",)


@dataclass
class EvalSpec:
    """How every policy of the grid is evaluated: held-out tasks committed against the real environment
    and scored by the benchmark's own scorer, with and without private rehearsal.

    Args:
        benchmark: ``bfcl`` (BFCL multi-turn, bfcl-eval's official checker), ``bfcl-single`` (BFCL
            single-turn AST items, the first act step judged by bfcl-eval's ``ast_checker``; no tool
            response, so no gold-call fidelity) or ``shopworld`` (docs/shopworld.md: ``gold-writes``,
            checked against the state-replay oracle; its task ids name their stratum, which a
            hypothesis's ``where: {task: ...}`` selects).
        splits: BFCL's ``val`` (unseen scenarios of the training API classes) and ``test`` (unseen
            classes); BFCL single-turn's ``test`` (the declared split by called function); ShopWorld's
            ``tune`` and ``test``; reported apart. ``bfcl-single`` reports each split's categories
            apart: its items are labelled ``<split>:<category>`` (:meth:`stratum`), the report's columns
            and a hypothesis's ``where: {split: ...}``, and the report's pooled figure is over them all.
        categories: BFCL multi-turn categories, or BFCL single-turn categories with a declared split
            (``bfcl-single`` needs them named; ShopWorld: every stratum is evaluated).
        max_user_turns: cut every task to its first user turns (the training episodes' length).
        max_prompt_tokens: keep the tasks whose prompt fits (as training's ``val_max_prompt_tokens``).
        tasks_per_split: at most this many tasks per split, spread over the split (``None``: all).
        n_values: private-rehearsal attempts per committed turn (0: plain execution).
        modes: private-rehearsal modes for every ``n > 0`` (``parallel``, ``sequential``).
        temperature: sampling temperature of the evaluation (0: greedy).
        batch_tasks: tasks whose episodes generate together.
        drift: drifts of the real environment, one evaluation unit per policy each: ``none`` (no
            drift) or ``{kinds: [...], mode: documented|silent, seed: 0}`` (docs/drift.md); empty: no
            drift axis (one unit per policy).
        reimagine: the drift mitigation for every ``n > 0`` setting (setting ``<mode>@<n>+reimagine<k>``):
            0, none; k, the rest of a user turn imagined again, at most k times, after a real response
            the rehearsal did not foresee (``ImaginationConfig.reimagine``).
        limits: the evaluation's episode limits over the base config's (``RolloutLimits`` fields),
            e.g. ``{max_steps_per_turn: 20}``, bfcl-eval's own step limit: a training limit of 2
            force-terminates every turn that needs two calls and a closing answer.
        rehearsal_seeds: the seeds whose runs are also evaluated with ``n > 0`` (the warm start always
            is; a run of another seed, with ``none`` only: a rehearsal setting costs 2-3 plain ones);
            ``None``: every seed. Seeds of the experiment's ``seeds``; ``n_values`` must hold 0.
        sampling: the evaluation's sampler over the base config's (``SamplingConfig`` fields but
            ``temperature``), e.g. ``{engine: vllm, vllm: {dtype: bfloat16}}``: the evaluation reads the
            base config, not ``fit_args``, so a grid whose runs sample on vLLM says so here too.
        gold_layouts: how the gold oracle lays out a turn's calls for the gold-call fidelity, each
            measured apart (:data:`~envace.rollout.reference.ORACLES`): ``call``, one gold call an act
            step, as every training episode is laid out; ``turn``, a turn's gold calls in one act step
            (what units written before this field measured: each rehearsal sees the turn's later gold
            calls, chosen from the real answers).
        part_tasks: the tasks of a split kept as one part of a resumable evaluation (a killed one
            resumes from its finished parts, :mod:`envace.experiment.parts`): each chunk of this many
            tasks is its own ``evaluate`` call, seeded afresh, and its own part; ``None``: a split is
            one part (the names of evaluations begun before this field). Greedy, the results do not
            depend on it; sampling (``temperature > 0``), they do (reproducibly for one value).
    """

    benchmark: Literal["bfcl", "bfcl-single", "shopworld"] = "bfcl"
    splits: list[str] = field(default_factory=lambda: ["val", "test"])
    categories: list[str] = field(default_factory=lambda: ["multi_turn_base"])
    max_user_turns: int = 1
    max_prompt_tokens: int | None = 1300
    tasks_per_split: int | None = None
    n_values: list[int] = field(default_factory=lambda: [0, 2])
    modes: list[str] = field(default_factory=lambda: ["parallel", "sequential"])
    temperature: float = 0.0
    batch_tasks: int = 16
    drift: list[Any] = field(default_factory=list)
    reimagine: list[int] = field(default_factory=lambda: [0])
    limits: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    rehearsal_seeds: list[int] | None = None
    gold_layouts: list[str] = field(default_factory=lambda: ["call"])
    part_tasks: int | None = 100

    def __post_init__(self) -> None:
        if self.benchmark not in SOURCES:
            raise ValueError(f"evaluation.benchmark must be one of {', '.join(SOURCES)}, got {self.benchmark!r}")
        wrong = [c for c in self.categories if c not in SPLIT_CATEGORIES]
        if self.benchmark == "bfcl-single" and (wrong or not self.categories):
            raise ValueError(
                f"evaluation.categories: bfcl-single needs single-turn categories with a declared split "
                f"({', '.join(SPLIT_CATEGORIES)}), got {self.categories}"
            )
        labels = [label for label, _ in drift_entries(self)]
        if len(set(labels)) != len(labels):
            raise ValueError(f"evaluation.drift names a drift twice: {', '.join(labels)}")
        bad = [r for r in self.reimagine if not isinstance(r, int) or isinstance(r, bool) or r < 0]
        if bad or not self.reimagine or len(set(self.reimagine)) != len(self.reimagine):
            raise ValueError(f"evaluation.reimagine must list distinct integers >= 0, got {self.reimagine}")
        known = {f.name for f in dataclasses.fields(RolloutLimits)}
        unknown = sorted(set(self.limits) - known)
        if unknown:
            raise ValueError(f"evaluation.limits: unknown limit {unknown[0]!r} (limits: {', '.join(sorted(known))})")
        known = {f.name for f in dataclasses.fields(SamplingConfig)} - {"temperature"}
        unknown = sorted(set(self.sampling) - known)
        if unknown:
            raise ValueError(
                f"evaluation.sampling: unknown or fixed field {unknown[0]!r} (temperature is "
                f"evaluation.temperature; fields: {', '.join(sorted(known))})"
            )
        _check_gold_layouts(self.gold_layouts)
        whole = isinstance(self.part_tasks, int) and not isinstance(self.part_tasks, bool) and self.part_tasks > 0
        if self.part_tasks is not None and not whole:
            raise ValueError(
                f"evaluation.part_tasks must be an integer > 0 (null: a split is one part), got {self.part_tasks!r}"
            )
        if self.rehearsal_seeds is not None:
            _check_rehearsal_seeds(self.rehearsal_seeds, self.n_values)

    @property
    def answers_calls(self) -> bool:
        """Whether the benchmark's environment answers a call (BFCL single-turn's does not: its answer is
        the first act step), so that the gold-call fidelity of a policy's rehearsal can be measured."""
        return self.benchmark != "bfcl-single"

    def stratum(self, split: str, category: str) -> str:
        """The label a unit's file and the report give an item of ``split`` and ``category``: the split,
        or ``<split>:<category>`` for a benchmark read per category (:data:`BY_CATEGORY`).

        >>> single = EvalSpec("bfcl-single", ["test"], ["multiple", "parallel"])
        >>> single.stratum("test", "multiple"), EvalSpec().stratum("test", "multi_turn_base")
        ('test:multiple', 'test')
        """
        return f"{split}:{category}" if self.benchmark in BY_CATEGORY else split

    def strata(self) -> list[str]:
        """Every label of :meth:`stratum`, split by split: the report's columns (``experiment.json``'s ``splits``).

        >>> EvalSpec("bfcl-single", ["test"], ["multiple", "parallel"]).strata(), EvalSpec(splits=["test"]).strata()
        (['test:multiple', 'test:parallel'], ['test'])
        """
        if self.benchmark not in BY_CATEGORY:
            return list(self.splits)
        return [self.stratum(s, c) for s in self.splits for c in self.categories]

    def settings(self, seed: int | None = None) -> list[tuple[str, int, int]]:
        """``(mode, n, reimagine)`` of every setting a policy of ``seed`` is evaluated under, plain execution
        first (``None``, the warm start: every setting; a seed not in ``rehearsal_seeds``: ``none`` only).

        >>> spec = EvalSpec(n_values=[0, 2], modes=["parallel"], rehearsal_seeds=[0])
        >>> spec.settings(), spec.settings(0), spec.settings(1)
        ([('none', 0, 0), ('parallel', 2, 0)], [('none', 0, 0), ('parallel', 2, 0)], [('none', 0, 0)])
        """
        out = [("none", 0, 0)] if any(n <= 0 for n in self.n_values) else []
        if seed is not None and self.rehearsal_seeds is not None and seed not in self.rehearsal_seeds:
            return out
        return out + [
            (m, n, r) for n in sorted(set(self.n_values)) if n > 0 for m in self.modes for r in self.reimagine
        ]


def _check_gold_layouts(layouts: Any) -> None:
    known = isinstance(layouts, list) and all(isinstance(x, str) and x in ORACLES for x in layouts)
    if not known or not layouts or len(set(layouts)) < len(layouts):
        raise ValueError(f"evaluation.gold_layouts must list distinct layouts of {', '.join(ORACLES)}, got {layouts!r}")


def _check_rehearsal_seeds(seeds: Any, n_values: list[int]) -> None:
    ints = isinstance(seeds, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    if not ints or not seeds or len(set(seeds)) < len(seeds):
        raise ValueError(f"evaluation.rehearsal_seeds must list distinct seeds (null: every seed), got {seeds!r}")
    if all(n > 0 for n in n_values):
        raise ValueError(
            f"evaluation.rehearsal_seeds needs a 0 in n_values (the other seeds are evaluated with "
            f"none only), got n_values {n_values}"
        )


def setting_label(mode: str, n: int, reimagine: int = 0) -> str:
    """An item's setting: ``none``, ``<mode>@<n>`` or ``<mode>@<n>+reimagine<k>``.

    >>> setting_label("none", 0), setting_label("parallel", 2), setting_label("parallel", 2, 1)
    ('none', 'parallel@2', 'parallel@2+reimagine1')
    """
    if n <= 0 or mode == "none":
        return "none"
    return f"{mode}@{n}" + (f"+reimagine{reimagine}" if reimagine else "")


def drift_label(spec: DriftSpec | None) -> str:
    """A drift's name in unit keys and reports: ``none``, or ``<kind>+<kind>/<mode>`` (``/seed<s>`` past 0).

    >>> drift_label(None), drift_label(DriftSpec(("units", "rename_tool"), "silent", 2))
    ('none', 'units+rename_tool/silent/seed2')
    """
    if spec is None:
        return NO_DRIFT
    return f"{'+'.join(spec.kinds)}/{spec.mode}" + (f"/seed{spec.seed}" if spec.seed else "")


def drift_entries(spec: EvalSpec) -> list[tuple[str, DriftSpec | None]]:
    """``(label, spec)`` of every drift of ``spec.drift`` (``None`` for ``none``); a bad entry is a one-line error."""
    out: list[tuple[str, DriftSpec | None]] = []
    for i, entry in enumerate(spec.drift):
        if entry in (NO_DRIFT, None):
            out.append((NO_DRIFT, None))
            continue
        if not isinstance(entry, dict) or set(entry) - {"kinds", "mode", "seed"}:
            raise ValueError(
                f"evaluation.drift[{i}]: expected 'none' or {{kinds: [...], mode: ..., seed: ...}}, got {entry!r}"
            )
        kinds = entry.get("kinds") or []
        drift = DriftSpec.parse(
            kinds if isinstance(kinds, str) else ",".join(map(str, kinds)),
            entry.get("mode", "documented"),
            entry.get("seed", 0),
        )
        out.append((drift_label(drift), drift))
    return out
