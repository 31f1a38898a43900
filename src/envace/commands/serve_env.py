"""``envace serve-env``: a trained policy's rehearse role served as an MCP server — a learned stand-in for your tools.

It exposes the tools of the environment the policy learned (names, descriptions, input schemas) and
answers each ``tools/call`` with the response the policy rehearses for it, given the session's
earlier calls and the responses it gave them as context. The tools come from the checkpoint's
manifest (:func:`manifest_path`: ``envace-tools.json`` in an export folder, ``<name>.tools.json``
beside a ``.ckpt``) when it has one, so no real server is needed; else from the ``tools/list`` of
the config's first training source, saved as the manifest for the next start.

The rehearsal is the training path itself, not a second one: a :class:`~envace.rollout.loop.Rollout`
(one per worker, each built once with its engine) whose act turns are the session's calls, ONE CALL
PER ACT TURN as the warm start laid them out (:class:`StepwiseOracle`), and whose tool turns
:class:`~envace.rollout.PolicyRehearsal` writes, decoded greedily; the earlier tool turns are written
again as sampled (:class:`SessionReplay`), so only the new call is rehearsed.

Arguments are checked first (``isError`` with the reason, nothing rehearsed): against the tool's schema,
and against ``--max_argument_bytes``. A rehearsed error, or a rehearsal that does not parse, answers
``isError`` with the error object as JSON text; a call the rehearsal cannot reach within
``max_episode_tokens`` answers ``NOT_REHEARSED`` and does not join the session's history, so the session
goes on. Over stdio the process is one session; over HTTP (``--port``, on 127.0.0.1 only) each MCP
session has its own history and lock, at most ``--max_sessions`` of them and none idle over
``--session_idle_s`` (a forgotten session's kept keys and values are freed with it); different sessions'
calls run at once on ``--workers`` workers, and no call waits over ``--busy_s`` (``BUSY``;
:mod:`envace.commands.serve_sessions`). ``--check N`` instead rehearses N responses to the val tasks'
gold calls beside the real server's (the same lockstep as validation) and prints their fidelity (exact
match, key F1, value F1, decision F1, ...).

    envace serve-env --fit_config configs/mcp_example.yaml --checkpoint runs/mcp_example/envace/checkpoints/last.ckpt
    envace serve-env --fit_config configs/mcp_example.yaml --checkpoint <export folder> --port 8001
    envace serve-env --fit_config configs/mcp_example.yaml --checkpoint <ckpt> --check 20
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from envace.commands.preflight import value
from envace.commands.serve_sessions import Key, Pool, Session, Sessions, busy, free_rows, mcp_server
from envace.data.sources import SourceSpec
from envace.data.sources.records import read_json
from envace.envs.base import SizeBounds, json_size, unusable_arguments
from envace.metrics.fidelity import NAMES, score_pair
from envace.policy import PolicySpec
from envace.protocol import render_calls
from envace.protocol.parse import CallError, validate_call
from envace.rollout import PolicyRehearsal, RolloutLimits, SamplingConfig
from envace.rollout.reference import DONE, ScriptedEngine, gold_calls
from envace.rollout.responders import Generation, Responder, ToolTurn
from envace.types import JSON, Task, ToolCall, ToolSchema, error_observation, is_error

#: the user turn the rehearsal sees: an MCP client has no user, only calls
USER_TURN = "Run these tool calls."
#: the answer to a call the rehearsal never reached (a rehearsal of an earlier call ended the episode)
NOT_REHEARSED = error_observation(
    "NOT_REHEARSED", "the session's calls so far and this one do not fit the rehearsal's budget (max_episode_tokens)"
)
#: the most calls one session holds (its episode's act steps)
MAX_SESSION_CALLS = 256
#: what ``--check`` reports: every fidelity score, ``decision_f1`` (the ids, SKUs, prices, stock and
#: statuses a next call reuses) included
SCORES = NAMES


def read_sources(config: str) -> tuple[SourceSpec, SourceSpec | None, str]:
    """The first training source of a fit config, its first val source (``None`` when it has none) and
    its policy's ``name_or_path``, read as ``envace fit`` reads them (:mod:`envace.commands.fit_config`)."""
    from envace.commands.fit_config import load_fit_config

    parsed = load_fit_config(["--config", config], partial=True)
    train, val = parsed.data.sources or [], parsed.data.val_sources or []
    if not train:
        raise ValueError(f"--fit_config {config}: no data.sources: which environment's tools to serve?")
    policy = value(parsed, "model.init_args.policy.name_or_path") or PolicySpec().name_or_path
    return SourceSpec.parse(train[0]), SourceSpec.parse(val[0]) if val else None, str(policy)


def kept_rows(rollout: Any) -> dict[Key, Any]:
    """The rows (keys and values) a worker's engine keeps between calls; none for an engine that keeps none."""
    kept = getattr(rollout.responder.rehearsal.engine, "kept", None)
    return kept.rows if kept is not None else {}


def free_worker_rows(rollout: Any, keys: set[Key]) -> None:
    """Drop ``keys``'s rows from the ones a worker's engine keeps."""
    free_rows(kept_rows(rollout), keys)


def served_tools(tasks: list[Task]) -> list[ToolSchema]:
    """Every tool of the tasks, once, in first-seen order."""
    return list({t["name"]: t for task in tasks for t in task.tools}.values())


class StepwiseOracle(ScriptedEngine):
    """Writes a session's calls one per act step, each after the response to the one before, as the
    warm start laid them out (:func:`envace.data.grounding.ground`, ``steps="call"``), then a closing text."""

    def text_for(self, episode: Any) -> str:
        calls, k = gold_calls(episode), episode.steps_in_turn
        return render_calls("", [calls[k]]) if k < len(calls) else DONE


class SessionReplay(Responder):
    """The session's earlier tool turns written again as the rehearsal sampled them (its very ids), then
    :class:`~envace.rollout.PolicyRehearsal` for the new call: the context is the one a full re-run
    would build (greedy), but only the new call's response is generated, and the engine's kept rows
    mean only the tokens since the last call are prefilled: a call's cost grows with its own tokens.

    Args:
        rehearsal: the responder that writes the new call's response.
    """

    def __init__(self, rehearsal: PolicyRehearsal):
        self.rehearsal = rehearsal
        self.known: list[ToolTurn] = []
        self.made: list[ToolTurn] = []  # this run's turns, known and new (the episode's records keep only responses)

    def bind(self, engine: Any, tokenizer: Any) -> None:
        self.rehearsal.bind(engine, tokenizer)

    def generation(self, episode: Any, call: ToolCall, max_new_tokens: int) -> Generation | None:
        if len(episode.calls) < len(self.known):
            return None
        gen = self.rehearsal.generation(episode, call, max_new_tokens)
        return dataclasses.replace(gen, turn=lambda sample: self._made(gen.turn(sample)))

    def respond(self, episodes: list[Any], calls: list[ToolCall]) -> list[ToolTurn]:
        for episode in episodes:
            episode.open_tool_turn()  # the header, as the rehearsal opened it
        return [self._made(self.known[len(episode.calls)]) for episode in episodes]

    def _made(self, turn: ToolTurn) -> ToolTurn:
        self.made.append(turn)
        return turn


@dataclass
class WorldModel:
    """The policy's rehearse role over one tool set, greedy; its sampling weights made once, at the first call.

    Args:
        policy: a loaded policy (:func:`envace.evaluation.policies.load_eval_policy`).
        tools: the tools served.
        system_prompt: the system turn of the learned tasks.
        limits: the rollout limits (``max_rehearse_tokens`` bounds each response).
        max_argument_bytes: a call whose arguments are longer is ``INVALID_ARGUMENTS``, nothing rehearsed.
        workers: rehearsals run at once (:class:`~envace.commands.serve_sessions.Pool`): each worker an
            engine of its own (whose kept keys and values are not shared between threads) over the one
            sampling copy of the weights; the engines' row caches share the one token bound.
        busy_s: the longest a call waits for its session's earlier call or for a worker; then ``BUSY``.
    """

    policy: Any
    tools: list[ToolSchema]
    system_prompt: str = ""
    limits: RolloutLimits = field(
        default_factory=lambda: RolloutLimits(max_rehearse_tokens=128, max_episode_tokens=8192)
    )
    max_argument_bytes: int = SizeBounds.max_argument_bytes
    workers: int = 2
    busy_s: float = 30.0
    pool: Pool[Any] = field(init=False, repr=False)  # of rollouts, each responder a SessionReplay
    _sampler: Any = field(default=None, init=False, repr=False)
    _made: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.pool = Pool(self.worker, self.workers, self.busy_s)

    def sampler(self) -> Any:
        """The weights every worker samples from (the engine's sampling copy, made once)."""
        from envace.rollout import GenerationEngine, make_engine

        with self._made:
            if self._sampler is None:
                self.policy.model.eval()  # once: no worker's stream toggles train/eval under another's
                tokenizer, fmt = self.policy.tokenizer, self.policy.fmt
                engine = make_engine(self.policy.model, tokenizer, fmt, SamplingConfig(temperature=0.0))
                self._sampler = engine.sampler() if isinstance(engine, GenerationEngine) else self.policy.model
            return self._sampler

    def worker(self, index: int) -> Any:
        """Worker ``index``: the rollout its rehearsals run through (its own engine over :meth:`sampler`)."""
        from envace.protocol.tokens import PieceEncoder
        from envace.rollout import make_engine
        from envace.rollout.loop import Rollout

        tokenizer = self.policy.tokenizer if index == 0 else copy.deepcopy(self.policy.tokenizer)  # not shared
        rows = SamplingConfig().row_cache_tokens // self.workers
        sampling = SamplingConfig(temperature=0.0, pack_weights=False, row_cache_tokens=rows)
        engine = make_engine(self.sampler(), tokenizer, self.policy.fmt, sampling)
        steps = dict(max_steps_per_turn=MAX_SESSION_CALLS + 1, max_calls_per_step=1, max_new_tokens=4096)
        oracle, replay = StepwiseOracle(tokenizer, engine.stop_ids), SessionReplay(PolicyRehearsal(engine))
        limits = dataclasses.replace(self.limits, **steps)
        return Rollout(oracle, self.policy.fmt, PieceEncoder(tokenizer), replay, limits, lockstep=True,
                       validate_calls=False)  # fmt: skip

    def turns(
        self, calls: list[ToolCall], known: list[ToolTurn] | None = None, session: Session | None = None
    ) -> list[ToolTurn] | None:
        """The tool turns of ``calls``, made in this order in one session: the first ``len(known)``
        written again as ``known`` holds them, the rest rehearsed; ``None`` when no worker came free
        within ``busy_s``. A ``session`` prefers the worker that served it last, and records this one."""
        task = Task("serve-env", "serve-env", system_prompt=self.system_prompt, tools=self.tools,
                    user_turns=[USER_TURN], gold=[list(calls)])  # fmt: skip
        with self.pool.lend(session.worker if session is not None else -1) as lent:
            if lent is None:
                return None
            index, rollout = lent
            rollout.responder.known, rollout.responder.made = list(known or []), []
            before = set(kept_rows(rollout))
            rollout.run([task], 1, seeds=[0])
            if session is not None:
                session.worker = index
                session.keep(index, kept_rows(rollout), before)
            return list(rollout.responder.made)

    def forget(self, session: Session) -> None:
        """Free a forgotten session's kept rows in every worker's engine that holds some (at once where
        the worker is free, else when its call gives it back)."""
        for index, keys in list(session.rows.items()):
            self.pool.when_free(index, functools.partial(free_worker_rows, keys=keys))

    def rehearse(self, calls: list[ToolCall]) -> list[JSON]:
        """The rehearsed responses of ``calls``, made in this order in one session (all rehearsed)."""
        turns = self.turns(calls)
        if turns is None:
            raise RuntimeError(f"no rehearsal worker free within {self.busy_s:g} s")
        return [turn.response for turn in turns]

    def refusal(self, call: ToolCall) -> JSON | None:
        """The error of a call that is not rehearsed: not a valid call of a served tool, or over the size bound."""
        reason = unusable_arguments(call.arguments)
        size = json_size(call.arguments) if reason is None else 0
        if size > self.max_argument_bytes:
            reason = f"arguments of {size} bytes, over the bound of {self.max_argument_bytes} (--max_argument_bytes)"
        if reason is not None:
            return error_observation(CallError.INVALID_ARGUMENTS, f"{call.name}: {reason}")
        return validate_call(call, self.tools)

    def answer(
        self, history: list[tuple[ToolCall, ToolTurn]], call: ToolCall, session: Session | None = None
    ) -> tuple[JSON, bool]:
        """``(response, is_error)`` of ``call`` after the session's ``history``; a rehearsal that ended
        at its end-of-turn joins the history, one cut short by its budget does not (nor a call the
        episode's budget cannot reach): the session goes on with the calls it had."""
        error = self.refusal(call)
        if error is not None:
            return error, True
        if len(history) >= MAX_SESSION_CALLS:
            return error_observation("SESSION_FULL", f"a session holds at most {MAX_SESSION_CALLS} calls"), True
        turns = self.turns([c for c, _ in history] + [call], [t for _, t in history], session)
        if turns is None:
            return busy("rehearsal worker", self.busy_s), True
        if len(turns) != len(history) + 1:
            return NOT_REHEARSED, True
        if turns[-1].stopped:
            history.append((call, turns[-1]))
        return turns[-1].response, is_error(turns[-1].response)

    def serve(self, session: Session, call: ToolCall) -> tuple[JSON, bool]:
        """:meth:`answer` under the session's own lock, waited for at most ``busy_s`` (:meth:`Session.serve`)."""
        return session.serve(self.answer, call, self.busy_s)

    def check(self, tasks: list[Task], n: int) -> dict[str, float]:
        """Mean fidelity of the first ``n`` rehearsed responses to the gold calls of ``tasks`` (at most
        ``n`` of them: each has one call or more) against the real server's, in lockstep."""
        tasks = tasks[:n]
        with self.pool.lend(-1) as lent:
            if lent is None:
                raise RuntimeError(f"no rehearsal worker free within {self.busy_s:g} s")
            lent[1].responder.known = []
            episodes = lent[1].run(tasks, 1, seeds=list(range(len(tasks))))
        pairs = [score_pair(p.rehearsed, p.real) for ep in episodes for p in ep.fidelity][:n]
        out = {name: fmean(getattr(s, name) for s in pairs) if pairs else float("nan") for name in SCORES}
        return {**out, "pairs": float(len(pairs)), "tasks": float(len(tasks))}


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


def manifest_path(checkpoint: str) -> Path:
    """Where the tools a checkpoint serves are saved: ``envace-tools.json`` in an export folder, or
    ``<name>.tools.json`` beside a ``.ckpt``."""
    path = Path(checkpoint)
    return path / "envace-tools.json" if path.is_dir() else path.with_name(path.name + ".tools.json")


def served_world(train: SourceSpec, checkpoint: str) -> tuple[list[ToolSchema], str]:
    """The tools and system prompt to serve: from the checkpoint's manifest when it has one (no real
    server needed), else from the training source (listed from the real server), then saved as its manifest."""
    manifest = manifest_path(checkpoint)
    if manifest.is_file():
        saved = read_json(manifest)
        if not isinstance(saved, dict) or not isinstance(saved.get("tools"), list):
            raise ValueError(f"{manifest}: a tool manifest is {{'tools': [...], 'system_prompt': str}}")
        return saved["tools"], str(saved.get("system_prompt") or "")
    tasks = train.load()
    tools, system = served_tools(tasks), tasks[0].system_prompt if tasks else ""
    with contextlib.suppress(OSError):  # a read-only checkpoint folder: served all the same, listed next time
        manifest.write_text(json.dumps({"tools": tools, "system_prompt": system}, indent=1) + "\n", encoding="utf-8")
    return tools, system


def serve_env(
    *,
    fit_config: str,
    checkpoint: str,
    port: int | None = None,
    check: int = 0,
    max_rehearse_tokens: int = 128,
    max_argument_bytes: int = SizeBounds.max_argument_bytes,
    max_sessions: int = 256,
    session_idle_s: float = 1800.0,
    workers: int = 2,
    busy_s: float = 30.0,
    policy: str | None = None,
) -> int:
    """Serve a trained policy's rehearse role as an MCP server (see the module docstring).

    Args:
        fit_config: the fit config the policy was trained with (its first training source gives the tools).
        checkpoint: a Lightning ``.ckpt`` or an ``envace export`` folder.
        port: serve streamable HTTP on 127.0.0.1:PORT/mcp; default: stdio.
        check: instead of serving, rehearse this many responses to the gold calls of the val tasks
            beside the real server's, and print their fidelity.
        max_rehearse_tokens: most tokens per rehearsed response.
        max_argument_bytes: a call whose arguments are longer (UTF-8 JSON) is ``INVALID_ARGUMENTS``.
        max_sessions: most sessions held at once (the least recently used is forgotten first).
        session_idle_s: a session idle for longer is forgotten.
        workers: rehearsals run at once, for different sessions (each holds its own engine rows).
        busy_s: the longest a call waits for a worker or its session's earlier call before it answers ``BUSY``.
        policy: the base model of a ``.ckpt`` that does not name one (default: the fit config's
            ``model.policy.name_or_path``).
    """
    from envace.commands.show import load_actor

    train, val, trained = read_sources(fit_config)
    tools, system_prompt = served_world(train, checkpoint)
    model = load_actor(policy or trained, checkpoint, None, 0)
    limits = RolloutLimits(max_rehearse_tokens=max_rehearse_tokens, max_episode_tokens=8192)
    world = WorldModel(model, tools, system_prompt, limits, max_argument_bytes, workers, busy_s)
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
    serve(mcp_server(world, Sessions(max_sessions, session_idle_s, forget=world.forget)), port)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``envace serve-env [--options]`` (``--help`` lists them)."""
    from jsonargparse import CLI

    return int(CLI(serve_env, args=argv, prog="envace serve-env"))
