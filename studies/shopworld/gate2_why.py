"""Why gate 2's first level lost fidelity: the rehearsals of the gold calls, E = 0 against E = 368.

    OMP_NUM_THREADS=1 .venv/bin/python studies/shopworld/gate2_why.py [--tasks 10] [--out FILE]

knob-368's warm start (128 sft episodes and 368 exploration transitions) rehearsed the test split's
gold calls with decision F1 0.137, against 0.267 for E = 0 (gate 1's warm start), while its rehearsals
became valid JSON more often. This script rehearses the gold calls of the first ``--tasks`` test
tasks of each stratum with both warm starts (their ``last.ckpt`` in the cache's work folders: the
weights the two result files record, checked by fingerprint) and counts, per tool, how often the real
answer and each rehearsal is an error (a top-level ``"error"`` key), with the decision F1; then the
same for the training data itself (the real answers of the 128 sft episodes and the 368 transitions).
It reads; it changes no rule and no result. ``--out`` keeps every (call, rehearsed, real) pair.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

from envace.data.grounding import ground
from envace.data.sources.shopworld import load_shopworld
from envace.experiment import runner
from envace.experiment.grid import WARM, load_config, result_path, units
from envace.metrics.fidelity import score_pair
from envace.types import is_error

HERE = Path(__file__).resolve().parent
CONFIGS = {0: HERE / "gate1.yaml", 368: HERE / "knob-368.yaml"}  # E -> the grid whose warm start it is


def first_per_stratum(tasks: list[Any], k: int) -> list[Any]:
    """The first ``k`` tasks of each stratum, in source order."""
    taken: Counter[str] = Counter()
    out = []
    for t in tasks:
        if taken[t.category] < k:
            taken[t.category] += 1
            out.append(t)
    return out


def checkpoint(cfg: Any) -> Path:
    """The grid's warm-start checkpoint, refused unless its weights are the ones its result file records."""
    warm = next(u for u in units(cfg) if u.key == WARM)
    last, result = runner.last_checkpoint(cfg, WARM), result_path(cfg, warm)
    if runner.fingerprint(last) != json.loads(result.read_text())["fingerprint"]:
        raise SystemExit(f"{last}: its weights are not the ones {result} records")
    return last


def rehearsals(e: int, tasks: list[Any], layout: str) -> list[dict[str, Any]]:
    """Every gold call of ``tasks`` rehearsed by E's warm start, beside the real answer (``layout``: the
    gold oracle's, :data:`envace.rollout.reference.ORACLES`)."""
    from envace.evaluation.policies import load_eval_policy
    from envace.experiment.evaluate import eval_settings
    from envace.rollout import make_engine
    from envace.rollout.reference import gold_rollout
    from envace.rollout.responders import PolicyRehearsal

    cfg = load_config(str(CONFIGS[e]))
    warm = next(u for u in units(cfg) if u.key == WARM)
    _, limits, sampling, loading = eval_settings(cfg, warm)  # as its eval-warm_start rehearsed
    policy = load_eval_policy(str(checkpoint(cfg)), loading)
    engine = make_engine(policy.model, policy.tokenizer, policy.fmt, sampling)
    rollout = gold_rollout(policy.tokenizer, policy.fmt, engine.stop_ids, PolicyRehearsal(engine=engine), limits,
                           layout)  # fmt: skip
    rows = []
    for ep in rollout.run(tasks, 1, seeds=list(range(len(tasks)))):
        for p in ep.fidelity:
            rows.append({"task": ep.task.id, "stratum": ep.task.category, "tool": p.call.name,
                         "call": p.call.arguments, "rehearsed": p.rehearsed, "real": p.real,
                         "decision_f1": score_pair(p.rehearsed, p.real).decision_f1})  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Per tool: pairs, real answers that are errors, rehearsals that are errors, mean decision F1."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["tool"]].append(r)
        by["all"].append(r)
    lines = [f"{'tool':<16} {'pairs':>5} {'real err':>8} {'rehearsed err':>13} {'decision F1':>11}"]
    for tool, rs in sorted(by.items(), key=lambda kv: kv[0] == "all"):
        real = fmean(is_error(r["real"]) for r in rs)
        fake = fmean(is_error(r["rehearsed"]) for r in rs)
        lines.append(f"{tool:<16} {len(rs):>5} {real:>8.2f} {fake:>13.2f} {fmean(r['decision_f1'] for r in rs):>11.3f}")
    return lines


def training_answers() -> list[str]:
    """The real answers the E = 368 warm start was trained on, by split and tool: how many are errors."""
    counts: Counter[tuple[str, str, bool]] = Counter()
    for split, limit in (("sft", 128), ("explore", 368)):
        for task in load_shopworld(split, limit=limit):
            for rec in ground(task).calls:
                counts[(split, rec.call.name, is_error(rec.response))] += 1
    lines = [f"{'split':<8} {'tool':<16} {'answers':>7} {'errors':>6}"]
    for split, tool in sorted({(s, t) for s, t, _ in counts}):
        ok, err = counts[(split, tool, False)], counts[(split, tool, True)]
        lines.append(f"{split:<8} {tool:<16} {ok + err:>7} {err:>6}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10, help="test tasks per stratum (default 10)")
    parser.add_argument("--layouts", nargs="+", default=["turn", "call"], help="gold layouts (default: both)")
    parser.add_argument("--out", type=Path, help="write every pair here (JSON lines)")
    args = parser.parse_args(argv)
    tasks = first_per_stratum(load_shopworld("test"), args.tasks)
    print("The training data's real answers:", *training_answers(), "", sep="\n")
    kept = []
    for layout in args.layouts:
        for e in CONFIGS:
            rows = rehearsals(e, tasks, layout)
            kept += [{"E": e, "layout": layout, **r} for r in rows]
            print(f"E = {e}, {layout} layout: the gold calls of {len(tasks)} test tasks", *table(rows), "", sep="\n",
                  flush=True)  # fmt: skip
    if args.out:
        args.out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


if __name__ == "__main__":
    main()
