"""serve-env's answers over a session: are calls 2-10 as valid as call 1? (#53, item 4)

    PYTHONPATH=src python studies/own_tools/serve_validity.py --checkpoint <ckpt or export> [--sessions 4] [--calls 10]
        [--fit_config configs/mcp_example.yaml]

The test tasks of a fit config's first training source (its ``path``, split ``test``; default: the shop
example's, examples/shop_mcp/tasks/test.jsonl), their gold calls in file order cut into sessions of
``--calls`` calls. Each session's calls run in one session of the real server the source's ``env``
names (one stdio server process) and are answered by serve-env's world model in one served session
(:class:`envace.commands.serve_env.WorldModel`, ``answer(history, call)``: the method the MCP server
calls, greedy, ``--max_rehearse_tokens`` as serve-env's default). Per answer, beside the real shop's
answer to the same call in the same session: parseable (``json_valid``, and not serve-env's own
``NOT_REHEARSED``), right shape (the same key paths: ``key_f1`` = 1), ``decision_f1`` (ids, SKUs,
prices, statuses a next call reuses: the fields ``DECISION_FIELDS`` names, of which a clinic's answers
hold only ``status``) and ``value_f1`` (every leaf); each for call 1 and for calls 2 to ``--calls``. Run it with
``PYTHONPATH`` on another checkout's ``src`` for that code's figures (the base's ``answer`` takes the
same arguments). The config's data section is read as written (inline in the file), not through
``load_fit_config``, so the script runs against checkouts older than that loader.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import fmean
from typing import Any

import yaml

from envace.commands import serve_env
from envace.commands.show import load_actor
from envace.data.sources import load_source
from envace.envs.base import make_environment
from envace.metrics.fidelity import json_valid, key_set_f1, leaf_value_f1
from envace.rollout import RolloutLimits

ROOT = Path(__file__).resolve().parents[2]


def _decision_f1() -> Any:
    """``decision_f1`` of the code run; ``None`` in code before it (``--rescore`` the saved rows with this checkout)."""
    try:
        from envace.metrics.fidelity import decision_f1
    except ImportError:
        return None
    return decision_f1


decision_f1 = _decision_f1()
METRICS = ("parseable", "right_shape", "decision_f1", "value_f1")
#: serve-env's own refusals: no rehearsal was written, so nothing parseable was answered
UNANSWERED = ("NOT_REHEARSED", "BUSY", "SESSION_FULL")
SHOP = ROOT / "configs/mcp_example.yaml"


def test_tasks(fit_config: Path) -> list[Any]:
    """The test split of the config's first training source (a ``tasks`` source), with its options (its ``env``)."""
    source = dict(yaml.safe_load(fit_config.read_text())["data"]["sources"][0])
    options = {**dict(source.pop("options", None) or {}), **{k: v for k, v in source.items() if k != "split"}}
    name, path = options.pop("name"), options.pop("path")
    server = options.get("env", {}).get("server")
    if isinstance(server, dict) and "command" in server:  # its relative paths are the repository's, wherever this runs
        server.setdefault("cwd", str(ROOT))
    return load_source(name, split="test", path=str(ROOT / path), **options)


def sessions(fit_config: Path, n: int, calls: int) -> tuple[list[Any], list[list[Any]]]:
    """The test tasks and ``n`` sessions of ``calls`` gold calls each (the first task's env runs them)."""
    tasks = test_tasks(fit_config)
    flat = [c for t in tasks for turn in t.gold for c in turn]
    return tasks, [flat[i * calls : (i + 1) * calls] for i in range(n) if len(flat) >= (i + 1) * calls]


def real_answers(task: Any, calls: list[Any]) -> list[Any]:
    env = make_environment(task)
    assert env is not None
    try:
        return [env.execute(c) for c in calls]
    finally:
        env.close()


def score(rehearsed: Any, real: Any) -> dict[str, float]:
    code = rehearsed.get("error", {}).get("code") if isinstance(rehearsed, dict) else None
    valid = json_valid(rehearsed) and code not in UNANSWERED
    decision = float("nan") if decision_f1 is None else decision_f1(rehearsed, real) if valid else 0.0
    return {"parseable": float(valid), "right_shape": float(valid and key_set_f1(rehearsed, real) == 1.0),
            "decision_f1": decision, "value_f1": leaf_value_f1(rehearsed, real) if valid else 0.0}  # fmt: skip


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The scores of call 1 and of the later calls, each a mean over the sessions' calls."""
    out: dict[str, Any] = {}
    for name, group in (
        ("call_1", [r for r in rows if r["call"] == 1]),
        ("calls_2+", [r for r in rows if r["call"] > 1]),
    ):
        out[name] = {m: round(fmean(r[m] for r in group), 3) for m in METRICS}
        out[name].update(n=len(group), p50_s=sorted(r["seconds"] for r in group)[len(group) // 2])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="a .ckpt or export folder; default: --policy as packaged")
    parser.add_argument(
        "--policy", default="smollm2-135m", help="the model (tiny, smollm2-135m), or the base of a .ckpt"
    )
    parser.add_argument("--fit_config", type=Path, default=SHOP, help="its first source's test tasks and server")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--max_rehearse_tokens", type=int, default=128)
    parser.add_argument("--rows", default=None, help="write every answer beside the real one here (JSON lines)")
    parser.add_argument("--rescore", default=None, help="score the rows a run wrote (no model) with this code")
    args = parser.parse_args()
    if args.rescore:
        rows = [json.loads(line) for line in Path(args.rescore).read_text().splitlines()]
        rows = [{**r, **score(r["rehearsed"], r["real"])} for r in rows]
        print(json.dumps({"rows": args.rescore, "sessions": len({r["session"] for r in rows}), **summary(rows)}))
        return
    tasks, plan = sessions(args.fit_config, args.sessions, args.calls)
    limits = RolloutLimits(max_rehearse_tokens=args.max_rehearse_tokens, max_episode_tokens=8192)
    world = serve_env.WorldModel(load_actor(args.policy, args.checkpoint, None, 0), serve_env.served_tools(tasks),
                                 tasks[0].system_prompt, limits)  # fmt: skip
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    for s, calls in enumerate(plan):
        history: list[Any] = []
        for k, (call, real) in enumerate(zip(calls, real_answers(tasks[0], calls), strict=True)):
            t0 = time.perf_counter()
            rehearsed, _ = world.answer(history, call)
            rows.append({"session": s, "call": k + 1, "seconds": round(time.perf_counter() - t0, 2),
                         **score(rehearsed, real), "rehearsed": rehearsed, "real": real})  # fmt: skip
    if args.rows:
        Path(args.rows).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(json.dumps({"code": serve_env.__file__, "config": str(args.fit_config), "checkpoint": args.checkpoint,
                      "sessions": len(plan),
                      "seconds": round(time.perf_counter() - began, 1), **summary(rows)}))  # fmt: skip
    for r in rows[: args.calls]:  # the first session, call by call
        print(json.dumps({k: r[k] for k in ("call", "rehearsed", "real")}, ensure_ascii=False)[:400])


if __name__ == "__main__":
    main()
