"""serve-env's cost per call as a session grows, and its memory over many sessions (#53, item 4).

    PYTHONPATH=src python studies/own_tools/serve_latency.py [--histories 1 10 30] [--samples 5] [--sessions 0]
        [--fit_config configs/mcp_clinic.yaml]

The world model of ``envace serve-env`` in-process (:class:`envace.commands.serve_env.WorldModel`,
``answer(history, call)``, the method the MCP server calls), over the shop example's two tools (or, with
``--fit_config``, the tools and the test tasks' gold calls in file order, cycled, of that config's first
training source, listed from its real server: :func:`serve_validity.test_tasks`), with the ``tiny``
policy (``--policy``; ``--checkpoint`` a trained one, unbiased) whose head is biased to end every
rehearsal at once (an untrained model rarely ends a tool turn, and a rehearsal cut short ends the
session's episode, so no history would build): what is timed is the serving machinery, not the model's
writing. ``--samples`` sessions are played call after call; the call made after h earlier ones is timed
for each h of ``--histories``: p50 and p95 of the wall time, and the median CPU time, in seconds.
``--sessions N`` instead answers one call in each of N sessions (the server's session table:
``Sessions`` where it exists, else a plain dict as before) and prints the process's resident memory
before and after, and the tokens the engines keep. The table is made as serve-env makes it (its
``forget`` hook, where the code has one, frees a dropped session's kept rows) and each call is answered
in its session (``serve``, where it exists). Run it with ``PYTHONPATH`` on another checkout's ``src``
for that code's figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import envace.rollout as rollout
from envace.commands import serve_env
from envace.commands.show import load_actor
from envace.rollout import RolloutLimits
from envace.types import ToolCall

TOOLS = [
    {"name": "place_order", "description": "Order a product; returns the order with its id.",
     "parameters": {"type": "object", "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
                    "required": ["sku", "quantity"]}},
    {"name": "order_status", "description": "The state of an order.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}},
]  # fmt: skip


ENGINES: list[Any] = []  # every engine the world model built (one, or one per call)
CALLS: list[ToolCall] = []  # --fit_config: its test tasks' gold calls, cycled


def prefilled() -> int:
    """Tokens prefilled so far by every engine built: what a call cost beyond its own generation."""
    return sum(e.stats.prefill_tokens for e in ENGINES)


def call(i: int) -> ToolCall:
    if CALLS:
        return CALLS[i % len(CALLS)]
    if i % 2:
        return ToolCall("order_status", {"order_id": f"A{1000 + i}"})
    return ToolCall("place_order", {"sku": "MUG-BLUE", "quantity": 1 + i % 3})


def world(name: str, tools: list[Any], system_prompt: str, checkpoint: str | None, max_rehearse: int) -> Any:
    policy = load_actor(name, checkpoint, None, 0)
    stop = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")

    def end_at_once(module: Any, inputs: Any, output: Any) -> Any:
        output[..., stop] += 1e4
        return output

    if checkpoint is None:  # a trained checkpoint ends its rehearsals itself
        policy.model.lm_head.register_forward_hook(end_at_once)
    make_engine = rollout.make_engine  # the hook must see the policy itself: no prepacked sampling copy

    def kept_engine(m: Any, t: Any, f: Any, s: Any = None) -> Any:
        ENGINES.append(make_engine(m, t, f, dataclasses.replace(s, pack_weights=False)))
        return ENGINES[-1]

    rollout.make_engine = kept_engine
    limits = RolloutLimits(max_rehearse_tokens=max_rehearse, max_episode_tokens=8192)
    return serve_env.WorldModel(policy, tools, system_prompt, limits)


def latencies(w: Any, histories: list[int], samples: int) -> dict[str, Any]:
    for i in range(3):  # warm: the engine (where it is kept), the kernels' first shapes
        w.answer([], call(i))
    took: dict[int, list[tuple[float, float, int]]] = {h: [] for h in histories}
    for _ in range(samples):  # whole sessions: each call continues the one before, as a client's do
        history: list[Any] = []
        for k in range(max(histories) + 1):
            began, began_cpu, tokens = time.perf_counter(), time.process_time(), prefilled()
            w.answer(history, call(k))
            if k in took:
                took[k].append((time.perf_counter() - began, time.process_time() - began_cpu, prefilled() - tokens))
            assert len(history) == k + 1, "a rehearsal did not end at its end-of-turn: no history builds"
    out: dict[str, Any] = {}
    for h, pairs in took.items():
        wall = sorted(p[0] for p in pairs)
        p95 = wall[min(len(wall) - 1, round(0.95 * (len(wall) - 1)))]
        cpu = statistics.median(p[1] for p in pairs)  # the cores are shared: CPU time is steadier than wall
        out[f"history_{h}"] = {"p50_s": round(statistics.median(wall), 3), "p95_s": round(p95, 3),
                               "cpu_p50_s": round(cpu, 3), "prefilled_p50": statistics.median(p[2] for p in pairs),
                               "n": len(wall)}  # fmt: skip
    return out


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def sessions(w: Any, n: int, max_sessions: int) -> dict[str, Any]:
    forget = {"forget": w.forget} if hasattr(w, "forget") else {}
    table = serve_env.Sessions(max_sessions, **forget) if hasattr(serve_env, "Sessions") else None
    plain: dict[str, list[Any]] = {}
    w.answer([], call(0))  # warm: the engine (where it is kept) and the first allocations
    before, began, began_cpu = rss_mb(), time.perf_counter(), time.process_time()
    for i in range(n):
        if table is not None and hasattr(w, "serve"):
            w.serve(table.session(f"s{i}"), call(i))
        else:
            w.answer(table.history(f"s{i}") if table is not None else plain.setdefault(f"s{i}", []), call(i))
    live = len(table.live) if table is not None else len(plain)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return {"sessions": n, "live_after": live, "rss_mb_before": round(before, 1), "rss_mb_after": round(rss_mb(), 1),
            "seconds": round(time.perf_counter() - began, 1), "cpu_seconds": round(time.process_time() - began_cpu, 1),
            "peak_rss_mb": peak, "kept_tokens_after": kept_tokens()}  # fmt: skip


def kept_tokens() -> int:
    """Tokens whose keys and values the world model's engines keep between calls (every engine built)."""
    return sum(len(key) for e in ENGINES if hasattr(e, "kept") for key in e.kept.rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histories", type=int, nargs="+", default=[1, 10, 30])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=0)
    parser.add_argument("--max_sessions", type=int, default=256, help="the session table's bound (serve-env's)")
    parser.add_argument("--policy", default="tiny", help="tiny, or a packaged model (smollm2-135m), or a .ckpt's base")
    parser.add_argument("--checkpoint", default=None, help="a trained .ckpt or export folder (no end-at-once bias)")
    parser.add_argument("--max_rehearse_tokens", type=int, default=16)
    parser.add_argument("--fit_config", type=Path, default=None, help="its first source's tools and test calls")
    args = parser.parse_args()
    tools, system_prompt = TOOLS, "You are the shop's assistant."
    if args.fit_config is not None:
        from serve_validity import test_tasks  # type: ignore[import-not-found]

        tasks = test_tasks(args.fit_config)
        tools, system_prompt = serve_env.served_tools(tasks), tasks[0].system_prompt
        CALLS.extend(c for t in tasks for turn in t.gold for c in turn)
    w = world(args.policy, tools, system_prompt, args.checkpoint, args.max_rehearse_tokens)
    result = (
        sessions(w, args.sessions, args.max_sessions) if args.sessions else latencies(w, args.histories, args.samples)
    )
    config = str(args.fit_config or "the shop's two tools")
    print(json.dumps({"code": serve_env.__file__, "config": config, **result}))


if __name__ == "__main__":
    main()
