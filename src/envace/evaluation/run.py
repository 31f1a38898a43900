"""``envace evaluate``: benchmark evaluation with test-time imagination (the paper's private rehearsal).

    envace evaluate --config configs/eval/bfcl.yaml --imagination.mode parallel --imagination.n 4
    envace evaluate --config configs/eval/bfcl.yaml --imagination.n_values [0,2,4] \
        --imagination.modes [parallel,sequential]
    envace evaluate --config configs/eval/tau2.yaml --policy runs/fit/version_0/checkpoints/last.ckpt
    envace evaluate --config configs/eval/bfcl.yaml --tasks.categories [multi_turn_base] \
        --drift rename_keys,add_fields --drift.mode silent --drift.seed 0

Every imagination setting (plain, or N imagined attempts, parallel or sequential) runs the same tasks
with the same seeds; each committed episode is scored by the benchmark's own scorer; the table,
per-item records, a plot and a summary go to ``out``. See ``docs/evaluation.md``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from envace.data.sources import SourceSpec
from envace.envs import task_drift
from envace.evaluation.base import Benchmark, ItemResult, TaskFilter, by_category, item_result
from envace.evaluation.bfcl import BFCLBenchmark
from envace.evaluation.bfcl_single import BFCLSingleBenchmark
from envace.evaluation.drift import DriftConfig, drift_note, drift_shorthand, drift_tasks
from envace.evaluation.intervals import bootstrap_interval
from envace.evaluation.others import FinMCPBenchmark, VitaBenchmark
from envace.evaluation.policies import Policy, PolicyConfig, load_eval_policy
from envace.evaluation.progress import Progress
from envace.evaluation.provenance import git_commit, versions
from envace.evaluation.report import Row, make_rows, sort_rows, to_markdown, write_outputs
from envace.evaluation.shopworld import ShopWorldBenchmark
from envace.evaluation.tasks import TasksBenchmark
from envace.evaluation.tau2 import Tau2Benchmark, model_user
from envace.evaluation.users import UserSimConfig
from envace.inference import ImaginationConfig, imagining_rollout
from envace.rewards.base import RewardOutput
from envace.rollout import ExternalSimulator, Responder, RolloutLimits, SamplingConfig, make_engine
from envace.types import Task

BenchmarkName = Literal["bfcl", "bfcl-single", "tau2", "vitabench", "finmcp", "shopworld"]
#: a user's own tasks, a split of a fit config's ``tasks`` source (:mod:`envace.evaluation.tasks`)
OwnTasks = Literal["tasks"]
REFERENCE_LIMITS = {"max_new_tokens": 16_384, "max_calls_per_step": 64, "max_episode_tokens": 10**7}


@dataclass
class EvalResult:
    """What :func:`evaluate` returns: the table rows, per-item results, notes, files and wall times."""

    rows: list[Row]
    items: list[ItemResult]
    notes: list[str]
    files: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def run_setting(
    bench: Benchmark,
    policy: Policy,
    tasks: list[Task],
    setting: ImaginationConfig,
    limits: RolloutLimits,
    sampling: SamplingConfig,
    seed: int,
    trial: int,
    batch_tasks: int,
    progress: Progress | None = None,
) -> list[ItemResult]:
    """Run and score every task once under one imagination setting (one trial); ``progress`` counts
    the scored items and the tokens the policy generates."""
    torch.manual_seed(seed + trial)
    engine = policy.engine(sampling, bench.oracle)
    if progress is not None:
        stats = engine.stats
        progress.track_tokens(lambda: stats.tokens)
    user = bench.user(policy)
    items = []
    by_cat: dict[str, list[Task]] = {}
    for t in tasks:
        by_cat.setdefault(bench.category(t), []).append(t)
    for category, group in by_cat.items():
        rollout = imagining_rollout(
            engine, policy.tokenizer, policy.fmt, bench.responder(policy), bench.limits(category, limits), setting,
            imagine=bench.imagine(policy), user=user, validate_calls=not policy.reference,
        )  # fmt: skip
        with bench.prepared(category, group, rollout.run) as ready:  # BFCL memory: its prerequisites
            for start in range(0, len(ready), max(1, batch_tasks)):
                for ep in rollout.run(ready[start : start + batch_tasks]):
                    try:
                        out = bench.score(ep)
                    except Exception as exc:  # a scorer that cannot score masks the item, never stops the run
                        out = RewardOutput(None, False, {"error": f"{type(exc).__name__}: {exc}"})
                    items.append(item_result(bench.name, ep, out, category, setting.mode, setting.n, trial))
                    if progress is not None:
                        progress.advance()
    return items


def _benchmark(
    name: BenchmarkName | OwnTasks, tasks: TaskFilter, user: UserSimConfig, solo: bool, trials: int,
    simulator: str | None, model: PolicyConfig, sampling: SamplingConfig, source: SourceSpec | None = None,
) -> Benchmark:  # fmt: skip
    if name == "tasks":
        return TasksBenchmark(tasks, source)

    def load(n: str) -> Policy:
        return load_eval_policy(n, model)

    make_user = model_user(user, load, sampling) if user.kind == "simulator" else None
    if name == "bfcl":
        return BFCLBenchmark(tasks)
    if name == "bfcl-single":
        return BFCLSingleBenchmark(tasks)
    if name == "tau2":
        return Tau2Benchmark(tasks, solo=solo, trials=trials, make_user=make_user)
    if name == "vitabench":
        sim = None if simulator is None else _external_simulator(load(simulator), sampling)
        return VitaBenchmark(tasks, simulator=sim, make_user=make_user)
    if name == "finmcp":
        return FinMCPBenchmark(tasks)
    if name == "shopworld":
        return ShopWorldBenchmark(tasks)
    raise ValueError(f"unknown benchmark {name!r}")


def _external_simulator(sim: Policy, sampling: SamplingConfig) -> Callable[[Policy], Responder]:
    """A committed responder factory: ``sim``'s frozen weights answer calls (``ExternalSimulator``),
    each response within the rollout's ``limits.max_rehearse_tokens``: inline in the episode when
    ``sim`` shares the policy's tokenizer (the same prompt as rehearsal), else from the simulator
    prompt in its own chat template."""

    def build(policy: Policy) -> Responder:
        if sim.tokenizer.get_vocab() == policy.tokenizer.get_vocab():
            return ExternalSimulator(make_engine(sim.model, policy.tokenizer, policy.fmt, sampling))
        engine = make_engine(sim.model, sim.tokenizer, sim.fmt, sampling)
        return ExternalSimulator(engine, tokenizer=sim.tokenizer, prompt="separate")

    return build


def _headline(bench: Benchmark, rows: list[Row]) -> tuple[str, str]:
    cats = [r.category for r in rows if r.metric == bench.headline]
    for preferred in ("[overall_evaluated]", "[all]"):
        if preferred in cats:
            return bench.headline, preferred
    return bench.headline, cats[0] if cats else ""


def evaluate(
    benchmark: BenchmarkName | OwnTasks = "bfcl",
    policy: str | Policy = "smollm2-135m",
    tasks: TaskFilter | None = None,
    imagination: ImaginationConfig | None = None,
    limits: RolloutLimits | None = None,
    sampling: SamplingConfig | None = None,
    model: PolicyConfig | None = None,
    user: UserSimConfig | None = None,
    solo: bool = False,
    simulator: str | None = None,
    trials: int = 1,
    seed: int = 0,
    batch_tasks: int = 16,
    drift: DriftConfig | None = None,
    out: str | None = "runs/eval",
    quiet: bool = False,
    progress_every: float = 5.0,
    source: SourceSpec | None = None,
) -> EvalResult:
    """Evaluate a policy on a benchmark under one or several test-time imagination settings.

    Args:
        benchmark: ``bfcl``, ``bfcl-single`` (BFCL single-turn AST items of the declared split by called
            function, default ``test``), ``tau2``, ``vitabench``, ``finmcp`` (OpenAI-chat logs with recorded
            results) or ``shopworld`` (docs/shopworld.md); ``tasks``: your own, a split of a fit config's
            tasks (``--tasks.path <fit config> --tasks.split test``; :mod:`envace.evaluation.tasks`).
        policy: a ``.ckpt`` checkpoint, a ``save_pretrained`` folder or hub id, ``smollm2-135m``
            (packaged), ``tiny`` (random, tests), or the reference policies ``oracle`` and ``noop``;
            or a policy already loaded by :func:`load_eval_policy` (``model`` is then not used to load it).
        tasks: which tasks (categories, split, a per-category limit, ids, max user turns, data path).
        imagination: the imagination setting, or a sweep (``n_values`` × ``modes``).
        limits: episode limits and generation budgets (``max_rehearse_tokens``: every generated tool
            response, imagined or committed); reference policies run without token and call limits.
        sampling: how the policy samples (and the user simulator, at its own temperature).
        model: how a model policy is loaded (dtype, chat format, tool rendering, ``.ckpt`` base).
        user: who plays the user on tau2 and VitaBench.
        solo: tau2: run telecom in tau2's solo mode.
        simulator: VitaBench: a model that answers committed calls (``ExternalSimulator``); default:
            the policy's own rehearsal.
        trials: runs of every task per setting, with seeds ``seed + trial`` (tau2's pass^k).
        seed: the base seed; two runs with one seed give identical tables.
        batch_tasks: tasks whose episodes (and imagined attempts) generate together.
        drift: drift every task's real environment (``--drift KINDS --drift.mode M --drift.seed S``;
            docs/drift.md): the policy meets an API that changed after training; ``None``: no drift.
        out: the output folder (``None``: write nothing).
        quiet: do not print progress and the table.
        progress_every: seconds between progress lines on stderr (items done, rate, time left); a
            heartbeat with the tokens generated so far fills longer gaps (``0``: per item only).
        source: ``tasks``: the source of your own tasks, the first of a fit config's ``data.sources``
            (``envace evaluate`` reads it from ``--tasks.path`` with
            :func:`envace.commands.fit_config.fit_source`).
    """
    tasks, imagination = tasks or TaskFilter(), imagination or ImaginationConfig()
    limits, sampling = limits or RolloutLimits(), sampling or SamplingConfig()
    model, user = model or PolicyConfig(), user or UserSimConfig()
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    spec = (drift or DriftConfig()).spec()  # a bad kind or mode fails before the policy loads
    began = time.perf_counter()
    loaded = policy if isinstance(policy, Policy) else None
    policy = loaded.name if loaded is not None else str(policy)
    log(f"[evaluate] {benchmark}: loading policy {policy} and the tasks")
    pol = loaded or load_eval_policy(policy, model)
    if pol.reference:
        limits = dataclasses.replace(limits, **{k: max(getattr(limits, k), v) for k, v in REFERENCE_LIMITS.items()})
    bench = _benchmark(benchmark, tasks, user, solo, trials, simulator, model, sampling, source)
    task_list = bench.tasks()
    if not task_list:
        raise ValueError(f"no {benchmark} tasks match {tasks}")
    if spec is not None:
        task_list = drift_tasks(task_list, spec)
    ready = time.perf_counter() - began
    log(f"[evaluate] {benchmark}: {len(task_list)} tasks, policy {policy} ({_rendering(pol)}), ready in {ready:.0f} s")
    result = EvalResult([], [], [])
    settings = imagination.settings()
    for i, setting in enumerate(settings, 1):
        t0 = time.perf_counter()
        label = f"evaluate {benchmark} {setting.mode} n={setting.n} [{i}/{len(settings)}]"
        got = []
        with Progress(label, len(task_list) * trials, every=progress_every, quiet=quiet) as progress:
            for trial in range(trials):
                got += run_setting(bench, pol, task_list, setting, limits, sampling, seed, trial, batch_tasks, progress)
        key = f"{setting.mode}-{setting.n}"
        result.seconds[key] = round(time.perf_counter() - t0, 2)
        result.items += got
        result.rows += make_rows(bench.name, setting.mode, setting.n, bench.summarize(got))
        log(f"[evaluate] {key}: {len(got)} episodes in {result.seconds[key]:.1f} s; successes {_wins(got)}")
    result.rows, result.notes = sort_rows(result.rows), bench.notes() + ([drift_note(spec)] if spec else [])
    if not quiet:
        print(to_markdown(result.rows, result.notes))
    if out is not None:
        arguments = {
            "benchmark": benchmark, "policy": policy, "tasks": tasks, "imagination": imagination, "limits": limits,
            "sampling": sampling, "model": model, "user": user, "solo": solo, "simulator": simulator,
            "trials": trials, "seed": seed, "batch_tasks": batch_tasks, "drift": drift,
        }  # fmt: skip
        log(f"[evaluate] writing {out} (the headline's 95 % intervals: a bootstrap over tasks per setting)")
        result.files = _write(Path(out), bench, pol, result, arguments, task_list, time.perf_counter() - began)
        log(f"[evaluate] wrote {', '.join(result.files.values())}")
    return result


def _write(
    out: Path, bench: Benchmark, pol: Policy, result: EvalResult, arguments: dict[str, Any], task_list: list[Task],
    seconds: float,
) -> dict[str, str]:  # fmt: skip
    """Write the outputs of a run (``arguments``: every argument of :func:`evaluate`, resolved)."""
    headline = _headline(bench, result.rows)
    intervals = _intervals(bench, result.items, headline, arguments["seed"])
    settings = arguments["imagination"].settings()
    meta = {
        "arguments": arguments, "policy": _policy_record(pol), "task_ids": [t.id for t in task_list],
        "tasks": len(task_list), "settings": settings, "drift": _drift_record(task_list),
        "seeds": [arguments["seed"] + t for t in range(arguments["trials"])],
        "headline": {"metric": headline[0], "category": headline[1]},
        "intervals": {f"{m}-{n}": iv for (m, n), iv in intervals.items()},
        "seconds": result.seconds, "total_seconds": round(seconds, 2), "versions": versions(), "git": git_commit(),
    }  # fmt: skip
    bars = {k: (iv["lo"], iv["hi"]) for k, iv in intervals.items()}
    return write_outputs(out, result.rows, result.items, result.notes, _plain(meta), headline, bars)


def _drift_record(tasks: list[Task]) -> dict[str, Any] | None:
    """The drift the tasks ran under (``summary.json``: kinds, mode, seed), ``None`` without."""
    drift = task_drift(tasks[0]) if tasks else None
    return None if drift is None else drift[0].to_json()


def _rendering(pol: Policy) -> str:
    """How the policy's prompts are rendered, for the log line."""
    fmt = type(pol.fmt).__name__
    style = f", tools {pol.fmt.tool_style}" if fmt == "HermesFormat" else ""
    step = f", step {pol.checkpoint.global_step}" if pol.checkpoint and pol.checkpoint.global_step is not None else ""
    return f"chat format {pol.chat_format} -> {fmt}{style}{step}"


def _policy_record(pol: Policy) -> dict[str, Any]:
    """What was loaded: the checkpoint (path, step, base, what it was trained with) and the rendering used."""
    return {
        "name": pol.name, "reference": pol.reference,
        "checkpoint": dataclasses.asdict(pol.checkpoint) if pol.checkpoint else None,
        "chat_format": pol.chat_format, "format": type(pol.fmt).__name__, "tool_style": pol.fmt.tool_style,
        "dtype": str(next(pol.model.parameters()).dtype) if pol.model is not None else None,
    }  # fmt: skip


def _intervals(
    bench: Benchmark, items: list[ItemResult], headline: tuple[str, str], seed: int
) -> dict[tuple[str, int], dict[str, Any]]:
    """The headline's 95 % interval per setting (stratified task bootstrap, :mod:`envace.evaluation.intervals`)."""
    out = {}
    per: dict[tuple[str, int], list[ItemResult]] = {}
    for it in items:
        per.setdefault((it.mode, it.n), []).append(it)
    for key, group in per.items():
        got = bootstrap_interval(bench.summarize, group, headline[0], headline[1], seed=seed)
        if got is not None:
            out[key] = {"lo": round(got[0], 6), "hi": round(got[1], 6), "level": 0.95, "replicates": got[2],
                        "method": "stratified task bootstrap (percentile)"}  # fmt: skip
    return out


def _plain(value: Any) -> Any:
    """``value`` with dataclasses as dicts (for ``summary.json``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _wins(items: list[ItemResult]) -> str:
    """Successes per category, for the progress line."""
    return ", ".join(f"{c} {sum(i.success for i in g)}/{len(g)}" for c, g in by_category(items).items())


def parser() -> Any:
    """The ``envace evaluate`` argument parser: ``--config`` files and every argument of :func:`evaluate`."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    p = ArgumentParser(prog="envace evaluate", description=__doc__.split("\n\n")[0], default_env=False)
    p.add_argument("--config", action=ActionConfigFile, help="a YAML config (configs/eval/<benchmark>.yaml)")
    p.add_function_arguments(evaluate, as_positional=False, skip={"source"})  # from --tasks.path
    return p


def parse(argv: list[str]) -> dict[str, Any]:
    """The keyword arguments of :func:`evaluate` for a command line (nested configs instantiated)."""
    p = parser()
    init = p.instantiate_classes(p.parse_args(drift_shorthand(argv)))
    return {name: init.get(name) for name in inspect.signature(evaluate).parameters if name != "source"}


def main(argv: list[str] | None = None) -> int:
    """``envace evaluate``: :func:`evaluate` from the command line and ``--config`` files (jsonargparse)."""
    evaluate(**parse(sys.argv[1:] if argv is None else list(argv)))
    return 0
