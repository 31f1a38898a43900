"""``envace show``: watch a policy rehearse one task (and act in it), next to the real environment.

(Called ``envace rehearse`` before; that name still works. "Rehearse" is the role that writes tool
responses; this command only shows one task.)

Runs ONE task with :class:`~envace.rollout.PolicyRehearsal` (the policy writes every tool turn) and,
when the task has a real environment, a lockstep copy that executes the same calls. Who writes the
calls is ``--actor``: by default the policy when a trained ``--checkpoint`` is given, else the
**oracle** (the task's gold calls): the untrained packaged model writes no call, so with it acting
nothing would be rehearsed, while with the oracle acting every gold call gets a rehearsed response
from the model next to the real one. The screen names who acted and who rehearsed. Prints:

1. the token episode, segment by segment, each line tagged ``[context]``, ``[act]`` or
   ``[rehearse]`` (the system turn and tool blocks shortened; :func:`transcript`);
2. a side-by-side table of the rehearsed and the real response of every call;
3. the episode's rehearsal fidelity (``fidelity/*``, overall, per benchmark, per tool);
4. the reward (:func:`envace.rewards.compute_reward`).

``--policy oracle`` / ``noop`` run the reference policies at no model cost: the oracle writes the
gold calls and rehearses perfectly (its tool turns are the real responses, written as ``rehearse``
tokens), so it scores reward 1 and fidelity 1 — a calibration of the scorers.

Checkpoints (``--checkpoint``) load as ``envace evaluate --policy`` loads them
(:func:`envace.evaluation.policies.load_eval_policy`): a ``save_pretrained`` folder as it is; a
Lightning ``.ckpt``'s ``policy.*`` weights into the model it names, else the model of ``--policy``.

A progress line on stderr every ``--progress_every`` seconds (tokens generated so far) keeps a
slow episode from looking hung. Example::

    envace show --task_id multi_turn_base_0                       # the oracle acts, smollm2-135m rehearses
    envace show --task_id multi_turn_base_0 --checkpoint runs/bfcl_sft/checkpoints/last.ckpt
"""

from __future__ import annotations

import json
import textwrap
import time
from typing import Any, NamedTuple

import torch

from envace.commands.preflight import check_model_source
from envace.data.sources import load_source
from envace.evaluation.policies import REFERENCE_POLICIES, Policy, PolicyConfig, load_eval_policy
from envace.evaluation.progress import Progress
from envace.metrics.fidelity import NAMES, fidelity_table
from envace.protocol.render import ChatFormat
from envace.rewards import compute_reward, reward_name
from envace.rollout import Engine, Episode, PolicyRehearsal, RolloutLimits, SamplingConfig, make_rollout
from envace.rollout.responders import Replay, Responder, ToolTurn
from envace.rollout.transcript import transcript
from envace.types import Task, ToolCall


# --- task and policy ---------------------------------------------------------------------------
def pick_task(source: str, split: str, path: str | None, task_id: str | None, max_user_turns: int | None) -> Task:
    """The task ``task_id`` of ``source`` (its first task when ``None``), cut to ``max_user_turns``."""
    tasks = load_source(source, split=split, path=path)
    if not tasks:
        raise ValueError(f"source {source!r} (split {split!r}) has no tasks")
    if task_id is None:
        return tasks[0].first_turns(max_user_turns)
    found = [t for t in tasks if t.id == task_id]
    if not found:
        raise ValueError(f"no task {task_id!r} in source {source!r} (split {split!r}); e.g. {tasks[0].id!r}")
    return found[0].first_turns(max_user_turns)


def load_actor(policy: str, checkpoint: str | None, tool_style: str | None, seed: int) -> Policy:
    """The policy ``policy`` (with the weights of ``checkpoint``), loaded for inference; ``tool_style``
    ``None``: the checkpoint's, else ``compact``."""
    if policy in REFERENCE_POLICIES and checkpoint:
        raise ValueError(f"the reference policy {policy!r} has no weights: drop --checkpoint or pick a model policy")
    check_model_source(checkpoint or policy, "--checkpoint" if checkpoint else "--policy", tuple(REFERENCE_POLICIES))
    config = PolicyConfig(base=policy, tool_style=tool_style, seed=seed)
    return load_eval_policy(checkpoint or policy, config, tool_style="compact")


class OracleRehearsal(Responder):
    """A perfect world model: the real response (or the recorded one), written as ``rehearse`` tokens.

    Args:
        fmt: the chat format (tool-turn body and end marker).
    """

    needs_env = True

    def __init__(self, fmt: ChatFormat):
        self.fmt = fmt
        self.tokenizer: Any = None

    def bind(self, engine: Engine, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def respond(self, episodes: list[Episode], calls: list[ToolCall]) -> list[ToolTurn]:
        turns = []
        for ep, call in zip(episodes, calls, strict=True):
            response = ep.execute_real(call) if ep.env is not None else Replay._lookup(ep, call)
            ep.open_tool_turn()
            text = self.fmt.tool_body(response) + self.fmt.tool().end
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            turns.append(ToolTurn(response, ids, [0.0] * len(ids), writer="oracle"))
        return turns


# --- printing ----------------------------------------------------------------------------------
def _cell(value: Any, width: int, max_lines: int = 6) -> list[str]:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return textwrap.wrap(text, width, max_lines=max_lines, placeholder=" …") or [""]


def side_by_side(ep: Episode, width: int = 44) -> str:
    """One row per call: the call, the response the episode used (rehearsed) and the real one."""
    real = [p.real for p in ep.fidelity] if len(ep.fidelity) == len(ep.calls) else None
    cols = [("#", 3), ("call", 30), ("rehearsed", width), ("real", width)]
    rule = "-+-".join("-" * w for _, w in cols)
    out = [" | ".join(name.ljust(w) for name, w in cols).rstrip(), rule]
    for i, rec in enumerate(ep.calls):
        args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in rec.call.arguments.items())
        cells = [[str(i)], _cell(f"{rec.call.name}({args})", 30),
                 _cell(rec.response, width), _cell(real[i], width) if real else ["(no real environment)"]]  # fmt: skip
        for k in range(max(len(c) for c in cells)):
            row = " | ".join((c[k] if k < len(c) else "").ljust(w) for c, (_, w) in zip(cells, cols, strict=True))
            out.append(row.rstrip())
        out.append(rule)
    if not ep.calls:
        out.append("(no calls)")
    return "\n".join(out)


def fidelity_report(ep: Episode) -> str:
    """The episode's ``fidelity/*`` figures: one row per group (all, benchmark, tool/<name>)."""
    if not ep.fidelity:
        return "fidelity: no (rehearsed, real) pairs (no calls, --real false, or no real environment)"
    values = fidelity_table(ep.fidelity)
    groups = [""] + sorted({k.split("/", 2)[2] for k in values if k.count("/") >= 2})
    head = ["fidelity/*".ljust(22), "pairs".rjust(5)] + [n.rjust(max(len(n), 6)) for n in NAMES]
    rows = [" ".join(head)]
    for g in groups:
        suffix = f"/{g}" if g else ""
        cells = [(g or "all").ljust(22), str(int(values[f"fidelity/pairs{suffix}"])).rjust(5)]
        cells += [f"{values[f'fidelity/{n}{suffix}']:.3f}".rjust(max(len(n), 6)) for n in NAMES]
        rows.append(" ".join(cells))
    return "\n".join(rows)


def report(ep: Episode, header: str, seconds: float) -> str:
    """Everything :func:`show` prints about the finished episode ``ep``."""
    roles = ep.role_tokens()
    reward = compute_reward(ep.task, ep.trajectory())
    score = "masked" if reward.score is None else f"{reward.score:.3f}"
    details = json.dumps(reward.details, default=str)[:300]
    return "\n".join([
        header,
        "\n== transcript ==", transcript(ep),
        f"\n== rehearsed vs real ({len(ep.calls)} calls) ==", side_by_side(ep),
        "\n== fidelity ==", fidelity_report(ep),
        f"\nreward: {score} (success {reward.success}, {reward_name(ep.task)}) {details}",
        f"episode: {ep.turn + 1} turn(s), {len(ep.calls)} calls, format errors {ep.format_errors}, "
        f"flags {sorted(ep.flags) or '-'}; tokens context {roles['context']} act {roles['act']} "
        f"rehearse {roles['rehearse']}; {seconds:.1f} s",
    ])  # fmt: skip


# --- the command -------------------------------------------------------------------------------
def who_acts(policy: str, checkpoint: str | None, actor: str) -> str:
    """``policy`` or ``oracle``: who writes the calls (``actor`` ``auto``: the policy when it is a
    reference policy or has a trained checkpoint, else the oracle)."""
    if actor not in ("auto", "policy", "oracle"):
        raise ValueError(f"--actor {actor!r}: use auto, policy or oracle")
    if policy in REFERENCE_POLICIES:
        if actor == "oracle" and policy != "oracle":
            raise ValueError(f"--policy {policy} is itself the actor: drop --actor oracle, or use --policy oracle")
        return "policy"
    if actor == "auto":
        return "policy" if checkpoint else "oracle"
    return actor


def show(
    source: str = "bfcl-multi-turn",
    task_id: str | None = None,
    split: str = "all",
    path: str | None = None,
    policy: str = "smollm2-135m",
    checkpoint: str | None = None,
    actor: str = "auto",
    tool_style: str | None = None,
    max_user_turns: int | None = 1,
    max_new_tokens: int = 128,
    rehearse_tokens: int = 128,
    seed: int = 0,
    real: bool = True,
    progress_every: float = 5.0,
) -> int:
    """Run one task with a policy rehearsing (and acting), and print what happened.

    Args:
        source: the task source (``bfcl-multi-turn``, ``tau2``, ...).
        task_id: the task to run; the source's first task when omitted.
        split: the source's split (``train``, ``test`` or ``all``).
        path: the source's data path, when it needs one.
        policy: ``smollm2-135m`` (packaged), a hub id or folder, ``tiny`` (random), or the reference
            policies ``oracle`` / ``noop`` (no model; they act, and the real responses are rehearsed).
        checkpoint: a ``save_pretrained`` folder, or a Lightning ``.ckpt`` whose ``policy.*`` weights
            are loaded into the model it names (else the model of ``policy``).
        actor: who writes the calls: ``policy`` (the model), ``oracle`` (the task's gold calls, the
            model rehearses their responses), or ``auto``: the model when ``checkpoint`` is given,
            else the oracle (an untrained model writes no call, so nothing would be rehearsed).
        tool_style: tool rendering in the system turn, ``compact`` or ``json``; default: what a
            ``.ckpt`` was trained with, else ``compact``.
        max_user_turns: keep only the first user turns of the task (all when omitted).
        max_new_tokens: most tokens per act turn of a model (scripted actors are not limited).
        rehearse_tokens: most tokens per rehearsed tool turn.
        seed: sampling seed (and the ``tiny`` model's weights).
        real: run a real environment in lockstep and compare (when the task has one).
        progress_every: seconds between progress lines on stderr while the episode runs (``0``: none).

    Returns:
        0 (the exit status).
    """
    torch.manual_seed(seed)
    acting = who_acts(policy, checkpoint, actor)
    task = pick_task(source, split, path, task_id, max_user_turns)
    model = load_actor(policy, checkpoint, tool_style, seed)
    who = cast(model, f"{policy}{f' + {checkpoint}' if checkpoint else ''}", acting)
    context = getattr(getattr(model.model, "config", None), "max_position_embeddings", 8192)
    limits = RolloutLimits(
        max_calls_per_step=16,
        max_new_tokens=4096 if who.scripted else max_new_tokens,
        max_rehearse_tokens=rehearse_tokens,
        max_episode_tokens=100_000 if model.reference else int(context),
    )
    lockstep = real and task.env is not None
    checked = model.reference or acting == "policy"  # the gold runs as the official harnesses run it
    rollout = make_rollout(who.engine, model.tokenizer, model.fmt, who.responder, limits, lockstep=lockstep,
                           validate_calls=checked)  # fmt: skip
    began = time.perf_counter()
    with Progress(f"show {task.id}", 1, every=progress_every, unit="episodes", quiet=progress_every <= 0) as progress:
        progress.track_tokens(lambda: who.writer.stats.tokens)
        ep = rollout.run([task], 1)[0]
    header = "\n".join([
        f"task {task.id} ({task.benchmark}/{task.category}), {len(task.user_turns)} user turn(s)",
        f"acted by:      {who.acted}",
        f"rehearsed by:  {who.rehearsed}",
        f"compared with: {'a real environment in lockstep (the same calls, in order)' if lockstep else 'nothing'}",
    ])  # fmt: skip
    print(report(ep, header, time.perf_counter() - began))
    if acting == "oracle" and not model.reference and checkpoint is None:
        print(f"\nhint: the oracle acted (the reward scores the gold calls) because no trained checkpoint was "
              f"given: an untrained model writes no call. --checkpoint runs/bfcl_sft/checkpoints/last.ckpt "
              f"(from envace fit --config configs/bfcl_sft.yaml) shows a trained policy acting and rehearsing; "
              f"--actor policy lets {policy} act.")  # fmt: skip
    return 0


class Cast(NamedTuple):
    """Who plays which part in :func:`show`: the acting engine, the responder, the engine whose
    tokens the progress line counts, the two lines of the screen, and whether the actor is scripted."""

    engine: Engine
    responder: Responder
    writer: Engine
    acted: str
    rehearsed: str
    scripted: bool


def cast(model: Policy, name: str, acting: str) -> Cast:
    """The parts of ``model`` (shown as ``name``) when ``acting`` (:func:`who_acts`) writes the calls."""
    if model.reference:
        engine = model.engine(SamplingConfig())
        what = "the gold calls" if model.name == "oracle" else "no call"
        return Cast(engine, OracleRehearsal(model.fmt), engine, f"{model.name} (a reference policy: {what})",
                    "the real responses, written as rehearse tokens (a perfect world model)", True)  # fmt: skip
    own = model.engine(SamplingConfig())
    rehearsed = f"{name} (its own weights write every tool response, the rehearse tokens)"
    if acting == "policy":
        return Cast(own, PolicyRehearsal(), own, f"{name} (the act tokens)", rehearsed, False)
    oracle = Policy("oracle", model.tokenizer, model.fmt).engine(SamplingConfig())
    return Cast(oracle, PolicyRehearsal(engine=own), own, "oracle (the task's gold calls, the act tokens)",
                rehearsed, True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``envace show [--options]`` (``--help`` lists them)."""
    from jsonargparse import CLI

    return int(CLI(show, args=argv, prog="envace show"))
