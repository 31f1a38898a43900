"""Agreement of our env-free BFCL multi-turn reward with bfcl-eval's official ``multi_turn_checker``.

::

    .venv/bin/python studies/reward_agreement/reward_agreement.py --out runs/reward_agreement.json
    .venv/bin/python studies/reward_agreement/reward_agreement.py --model_tasks 0  # scripted episodes only (seconds)
    .venv/bin/python studies/reward_agreement/reward_agreement.py --probes true  # add the probes (docs/rewards.md)
    .venv/bin/python studies/reward_agreement/reward_agreement.py --per_category 1 --kinds '[extra_write_after]'

Episodes: (a) for ``per_category`` tasks of each BFCL multi-turn category and each perturbation kind
(`agreement.KINDS`; the extra-write kinds that many per API class), the gold with
one perturbation, written by a scripted engine into the ordinary rollout loop with the ``RealEnvironment``
responder; (b) ``model_tasks x group_size``
episodes written by the packaged SmolLM2-135M (compact tools, tasks cut to ``max_user_turns``). Each is
scored by ``bfcl_multi_turn`` (strict all-turns flag) and by the official checker on its committed calls.
Prints the 2x2 table, agreement, Cohen's kappa, per-kind and per-class counts (``ours_only``: a false
positive, ours passes what the official checker fails) and every disagreement; ``docs/rewards.md``
explains them.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jsonargparse
from agreement import COUNTS, KINDS, PROBES, Row, confusion, run_scripted, score_episode, select

from envace.data.sources.bfcl import MULTI_TURN_CATEGORIES, load_multi_turn
from envace.policy import load_tokenizer
from envace.protocol.render import HermesFormat
from envace.types import Task

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
FMT = HermesFormat(tool_style="compact")


def model_rows(
    tasks: list[Task], n_tasks: int, group_size: int, max_user_turns: int, max_new_tokens: int, temperature: float,
    seed: int,
) -> list[Row]:  # fmt: skip
    """Episodes of the packaged SmolLM2 on ``n_tasks`` tasks (categories in turn), ``group_size`` each."""
    import torch

    from envace.policy import load_policy
    from envace.rollout import RealEnvironment, RolloutLimits, SamplingConfig, make_engine, make_rollout

    torch.manual_seed(seed)
    rng = random.Random(seed)
    pools = {c: [t for t in tasks if t.category == c] for c in MULTI_TURN_CATEGORIES}
    chosen = [rng.choice(pools[MULTI_TURN_CATEGORIES[i % len(MULTI_TURN_CATEGORIES)]]) for i in range(n_tasks)]
    chosen = [t.first_turns(max_user_turns) for t in chosen]
    model, tokenizer = load_policy()
    model.eval()
    engine = make_engine(model, tokenizer, FMT, SamplingConfig(temperature=temperature, batch_size=group_size))
    limits = RolloutLimits(max_steps_per_turn=2, max_new_tokens=max_new_tokens, max_episode_tokens=12_000)
    rollout = make_rollout(engine, tokenizer, FMT, RealEnvironment(), limits)
    rows = []
    for task in chosen:  # one task at a time: its group shares the prefilled tool block
        with torch.no_grad():
            episodes = rollout.run([task], group_size)
        rows += [score_episode(ep, "smollm2", "sampled", f"{ep.turn + 1} turns, flags {sorted(ep.flags)}")
                 for ep in episodes]  # fmt: skip
    return rows


def _table(title: str, counts: dict[str, dict[str, int]]) -> None:
    print(f"\n{title:30}" + "".join(f"{c:>14}" for c in COUNTS))
    for name, k in counts.items():
        print(f"{name:30}" + "".join(f"{k[c]:>14}" for c in COUNTS))


def report(rows: list[Row]) -> dict[str, Any]:
    """Print the table, the per-kind and per-class counts and every disagreement; return them as a dict."""
    c = confusion(rows)
    m = c["matrix"]
    print(f"N = {c['n']}  agreement = {100 * c['agreement']:.1f} %  kappa = {c['kappa']:.3f}")
    print(f"{'':14}{'official pass':>15}{'official fail':>15}")
    for ours in ("ours_pass", "ours_fail"):
        print(f"{ours:14}{m[ours]['official_pass']:>15}{m[ours]['official_fail']:>15}")
    _table("kind", c["by_kind"])
    _table("API class (extra writes)", c["by_class"])
    _table("extra write answered", c["by_fate"])
    _table("per-class kind / API class", c["by_kind_class"])
    disagreements = [r for r in rows if not r.agree]
    print(f"\n{len(disagreements)} disagreements:")
    for r in disagreements:
        print(f"- {r.task_id} [{r.source}/{r.kind}] {r.note}\n    ours={r.ours} turns={r.turns} {r.failures}"
              f"\n    official={r.official} {r.error_type or ''}: {r.error_message or ''}")  # fmt: skip
    return {**c, "disagreements": [asdict(r) for r in disagreements]}


def main(
    per_category: int = 4,
    seed: int = 0,
    kinds: list[str] | None = None,
    probes: bool = False,
    model_tasks: int = 4,
    group_size: int = 3,
    max_user_turns: int = 2,
    max_new_tokens: int = 48,
    temperature: float = 0.7,
    threads: int = 2,
    out: str | None = None,
) -> dict[str, Any]:
    """Run the measurement, print it, and write the JSON to ``out`` when given.

    Args:
        per_category: scripted episodes per perturbation kind and category (each on its own task), per
            API class for the extra-write kinds; the run's size and time scale with it.
        seed: seeds the task draw, the perturbation picks and the model's sampling.
        kinds: the perturbation kinds to run (default: all of `agreement.KINDS`).
        probes: also run `agreement.PROBES` (known, documented differences).
        model_tasks: tasks the packaged SmolLM2 attempts (0: scripted episodes only).
        group_size: SmolLM2 episodes per task.
        max_user_turns: SmolLM2 tasks are cut to their first turns (gold and checker ground truth alike).
        max_new_tokens: tokens per SmolLM2 act step.
        temperature: SmolLM2 sampling temperature.
        threads: torch CPU threads for the model.
        out: path of the JSON report (rows included).
    """
    import torch

    torch.set_num_threads(threads)
    began = time.perf_counter()
    tasks = load_multi_turn("all")
    items = select(tasks, tuple(kinds or KINDS) + (PROBES if probes else ()), per_category, seed)
    rows = run_scripted(items, load_tokenizer(), FMT)
    scripted_s = time.perf_counter() - began
    if model_tasks:
        rows += model_rows(tasks, model_tasks, group_size, max_user_turns, max_new_tokens, temperature, seed)
    result = report(rows)
    result["seconds"] = {"scripted": round(scripted_s, 1), "total": round(time.perf_counter() - began, 1)}
    result["config"] = {"per_category": per_category, "seed": seed, "kinds": kinds, "probes": probes,
                        "model_tasks": model_tasks,
                        "group_size": group_size, "max_user_turns": max_user_turns, "max_new_tokens": max_new_tokens,
                        "temperature": temperature}  # fmt: skip
    result["rows"] = [asdict(r) for r in rows]
    print(f"\nwall time: scripted {scripted_s:.1f} s, total {result['seconds']['total']:.1f} s")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    jsonargparse.CLI(main)
