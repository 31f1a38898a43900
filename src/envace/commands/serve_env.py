"""``envace serve-env``: a trained policy's rehearse role served as an MCP server — a learned stand-in for your tools.

It exposes the tools of the environment the policy learned (names, descriptions, input schemas:
the ``tools/list`` of the config's first training source) and answers each ``tools/call`` with the
response the policy rehearses for it, given the session's earlier calls and the responses it gave
them as context. The rehearsal is the training path itself, not a second one: the oracle rollout
of the validation's gold-call fidelity (:func:`envace.rollout.reference.gold_rollout`: the session's
calls written as the act turn, :class:`~envace.rollout.PolicyRehearsal` writing every tool turn),
decoded greedily. Greedy decoding makes the served history reproducible, so each call re-runs the
session's calls so far and answers the last one (a session of n calls costs n rehearsals).

Arguments are validated against the tool's schema first (``isError`` with the reason, nothing
rehearsed); a rehearsed error, or a rehearsal that does not parse, answers ``isError`` with the
error object as JSON text (a rehearsal of an earlier call that ran out of its token budget ends the
session's episode: later calls answer ``NOT_REHEARSED``). Over
stdio the process is one session; over HTTP (``--port``, on 127.0.0.1 only) each MCP session has its
own history. ``--check N`` instead rehearses N responses to the val tasks' gold calls beside the
real server's (the same lockstep as validation) and prints their fidelity (exact match, key F1,
value F1, ...).

    envace serve-env --fit_config configs/mcp_example.yaml --checkpoint runs/mcp_example/envace/checkpoints/last.ckpt
    envace serve-env --fit_config configs/mcp_example.yaml --checkpoint <export folder> --port 8001
    envace serve-env --fit_config configs/mcp_example.yaml --checkpoint <ckpt> --check 20
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

import yaml

from envace.data.sources import SourceSpec
from envace.metrics.fidelity import score_pair
from envace.protocol.parse import validate_call
from envace.rollout import PolicyRehearsal, RolloutLimits, SamplingConfig
from envace.rollout.reference import gold_rollout
from envace.types import JSON, Task, ToolCall, ToolSchema, is_error

#: the user turn the rehearsal sees: an MCP client has no user, only calls
USER_TURN = "Run these tool calls."
#: the answer to a call the rehearsal never reached (a rehearsal of an earlier call ended the episode)
NOT_REHEARSED = {
    "error": {"code": "NOT_REHEARSED", "message": "the rehearsal of an earlier call ended the session's episode"}
}
SCORES = ("json_valid", "exact_match", "key_f1", "value_f1", "error_agreement")


def read_sources(config: str) -> tuple[SourceSpec, SourceSpec | None]:
    """The first training source of a fit config and its first val source (``None`` when it has none)."""
    try:
        data = (yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}).get("data") or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--fit_config {config}: {str(exc).splitlines()[0]}") from None
    train, val = data.get("sources") or [], data.get("val_sources") or []
    if not train:
        raise ValueError(f"--fit_config {config}: no data.sources: which environment's tools to serve?")
    return SourceSpec.parse(train[0]), SourceSpec.parse(val[0]) if val else None


def served_tools(tasks: list[Task]) -> list[ToolSchema]:
    """Every tool of the tasks, once, in first-seen order."""
    return list({t["name"]: t for task in tasks for t in task.tools}.values())


@dataclass
class WorldModel:
    """The policy's rehearse role over one tool set, greedy.

    Args:
        policy: a loaded policy (:func:`envace.evaluation.policies.load_eval_policy`).
        tools: the tools served.
        system_prompt: the system turn of the learned tasks.
        limits: the rollout limits (``max_rehearse_tokens`` bounds each response).
    """

    policy: Any
    tools: list[ToolSchema]
    system_prompt: str = ""
    limits: RolloutLimits = field(
        default_factory=lambda: RolloutLimits(max_rehearse_tokens=128, max_episode_tokens=8192)
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rollout(self) -> Any:
        from envace.rollout import make_engine

        engine = make_engine(self.policy.model, self.policy.tokenizer, self.policy.fmt, SamplingConfig(temperature=0.0))
        return gold_rollout(self.policy.tokenizer, self.policy.fmt, engine.stop_ids, PolicyRehearsal(engine=engine),
                            self.limits)  # fmt: skip

    def rehearse(self, calls: list[ToolCall]) -> list[JSON]:
        """The rehearsed responses of ``calls``, made in this order in one session."""
        task = Task("serve-env", "serve-env", system_prompt=self.system_prompt, tools=self.tools,
                    user_turns=[USER_TURN], gold=[list(calls)])  # fmt: skip
        with self.lock:  # one rehearsal at a time: the engine's caches are the model's
            (ep,) = self.rollout().run([task], 1, seeds=[0])
        return [record.response for record in ep.calls]

    def answer(self, history: list[ToolCall], call: ToolCall) -> tuple[JSON, bool]:
        """``(response, is_error)`` of ``call`` after ``history``; a valid call joins the history."""
        error = validate_call(call, self.tools)
        if error is not None:
            return error, True
        responses = self.rehearse([*history, call])
        history.append(call)
        response = responses[-1] if len(responses) == len(history) else NOT_REHEARSED
        return response, is_error(response)

    def check(self, tasks: list[Task], n: int) -> dict[str, float]:
        """Mean fidelity of the first ``n`` rehearsed responses to the gold calls of ``tasks`` (at most
        ``n`` of them: each has one call or more) against the real server's, in lockstep."""
        tasks = tasks[:n]
        pairs = [score_pair(p.rehearsed, p.real) for ep in self.rollout().run(tasks, 1, seeds=list(range(len(tasks))))
                 for p in ep.fidelity][:n]  # fmt: skip
        out = {name: fmean(getattr(s, name) for s in pairs) if pairs else float("nan") for name in SCORES}
        return {**out, "pairs": float(len(pairs)), "tasks": float(len(tasks))}


def mcp_server(world: WorldModel) -> Any:
    """The low-level SDK server answering ``tools/list`` and ``tools/call`` from ``world``."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server

    sessions: dict[str, list[ToolCall]] = {}
    listed = [types.Tool(name=t["name"], description=t.get("description") or "",
                         input_schema=t.get("parameters") or {"type": "object"}) for t in world.tools]  # fmt: skip

    async def list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: Any) -> Any:
        headers = getattr(getattr(ctx, "request", None), "headers", None)
        history = sessions.setdefault(headers.get("mcp-session-id", "") if headers is not None else "stdio", [])
        call = ToolCall(params.name, dict(params.arguments or {}))
        response, failed = await anyio.to_thread.run_sync(world.answer, history, call)
        text = json.dumps(response, ensure_ascii=False)
        structured = response if isinstance(response, dict) and not failed else None  # the JSON as text too
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=structured, is_error=failed)  # fmt: skip

    return Server("envace-world-model", on_list_tools=list_tools, on_call_tool=call_tool)


def serve(server: Any, port: int | None) -> None:
    """Run ``server`` over stdio, or streamable HTTP on 127.0.0.1:``port``/mcp."""
    import anyio

    if port is None:
        from mcp.server.stdio import stdio_server

        async def stdio() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(stdio)
        return
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()


def serve_env(
    *,
    fit_config: str,
    checkpoint: str,
    port: int | None = None,
    check: int = 0,
    max_rehearse_tokens: int = 128,
    policy: str = "smollm2-135m",
) -> int:
    """Serve a trained policy's rehearse role as an MCP server (see the module docstring).

    Args:
        fit_config: the fit config the policy was trained with (its first training source gives the tools).
        checkpoint: a Lightning ``.ckpt`` or an ``envace export`` folder.
        port: serve streamable HTTP on 127.0.0.1:PORT/mcp; default: stdio.
        check: instead of serving, rehearse this many responses to the gold calls of the val tasks
            beside the real server's, and print their fidelity.
        max_rehearse_tokens: most tokens per rehearsed response.
        policy: the base model of a ``.ckpt`` that does not name one.
    """
    from envace.commands.show import load_actor

    train, val = read_sources(fit_config)
    tasks = train.load()
    model = load_actor(policy, checkpoint, None, 0)
    limits = RolloutLimits(max_rehearse_tokens=max_rehearse_tokens, max_episode_tokens=8192)
    world = WorldModel(model, served_tools(tasks), tasks[0].system_prompt if tasks else "", limits)
    if check:
        if val is None:
            raise ValueError(f"--check needs data.val_sources in {fit_config}")
        scores = world.check([t.first_turns(1) for t in val.load()], check)
        print(f"envace serve-env --check {check}: {checkpoint} rehearsed {int(scores['pairs'])} responses to the gold "
              f"calls of {int(scores['tasks'])} {val.split} tasks, beside the real server's")  # fmt: skip
        print("  " + "  ".join(f"{name} {scores[name]:.3f}" for name in SCORES))
        return 0
    where = f"streamable HTTP at http://127.0.0.1:{port}/mcp" if port else "stdio"
    print(f"envace serve-env: {checkpoint} rehearsing {len(world.tools)} tools over {where} (greedy): "
          f"{', '.join(t['name'] for t in world.tools)}", file=sys.stderr)  # fmt: skip
    serve(mcp_server(world), port)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``envace serve-env [--options]`` (``--help`` lists them)."""
    from jsonargparse import CLI

    return int(CLI(serve_env, args=argv, prog="envace serve-env"))
