"""``envace rehearse``: watch the policy act and rehearse one task, next to the real environment.

Runs ONE task with :class:`~envace.rollout.PolicyRehearsal` (the policy writes every tool turn) and,
when the task has a real environment, a lockstep copy that executes the same calls. Prints:

1. the token episode, segment by segment, each line tagged ``[context]``, ``[act]`` or
   ``[rehearse]`` (the system turn and tool blocks shortened);
2. a side-by-side table of the rehearsed and the real response of every call;
3. the episode's rehearsal fidelity (``fidelity/*``, overall, per benchmark, per tool);
4. the reward (:func:`envace.rewards.compute_reward`).

``--policy oracle`` / ``noop`` run the reference policies at no model cost: the oracle writes the
gold calls and rehearses perfectly (its tool turns are the real responses, written as ``rehearse``
tokens), so it scores reward 1 and fidelity 1 — a calibration of the scorers.

Checkpoints (``--checkpoint``): a folder saved with ``save_pretrained`` is loaded as the policy; a
Lightning ``.ckpt`` is read with ``torch.load(weights_only=True)`` and its ``state_dict`` entries
prefixed ``policy.`` are loaded into the model built from ``--policy``. That is the contract with
the training LightningModule, which holds the Hugging Face model as attribute ``policy``. A LoRA
checkpoint (peft keys, trainable weights only) also needs ``hyper_parameters["policy"]`` (a
:class:`~envace.policy.PolicySpec` or its dict) to rebuild the adapters.

Example::

    envace rehearse --task_id multi_turn_base_0 --policy smollm2-135m --max_user_turns 1
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from envace.data.sources import load_source
from envace.metrics.fidelity import NAMES, fidelity_table
from envace.policy import PolicySpec, load_checkpoint, load_model, load_tokenizer
from envace.protocol import tool_name
from envace.protocol.render import ChatFormat, make_format
from envace.rewards import compute_reward, reward_name
from envace.rollout import Engine, Episode, PolicyRehearsal, RolloutLimits, make_engine, make_rollout, stop_ids
from envace.rollout.reference import NoopEngine, OracleEngine
from envace.rollout.responders import Replay, Responder, ToolTurn
from envace.types import ROLE_IDS, Task, ToolCall

REFERENCE = {"oracle": OracleEngine, "noop": NoopEngine}
TAGS = {rid: f"[{role}]" for role, rid in ROLE_IDS.items()}
_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)


# --- task and policy ---------------------------------------------------------------------------
def pick_task(source: str, split: str, path: str | None, task_id: str | None, max_user_turns: int | None) -> Task:
    """The task ``task_id`` of ``source`` (its first task when ``None``), cut to ``max_user_turns``."""
    tasks = load_source(source, split=split, path=path)
    if not tasks:
        raise ValueError(f"source {source!r} (split {split!r}) has no tasks")
    if task_id is None:
        task = tasks[0]
    else:
        found = [t for t in tasks if t.id == task_id]
        if not found:
            raise ValueError(f"no task {task_id!r} in source {source!r} (split {split!r}); e.g. {tasks[0].id!r}")
        task = found[0]
    if max_user_turns is not None and len(task.user_turns) > max_user_turns:
        task = dataclasses.replace(task, user_turns=task.user_turns[:max_user_turns], gold=task.gold[:max_user_turns])
    return task


def load_actor(policy: str, checkpoint: str | None, tool_style: str, seed: int) -> tuple[Engine, Any, ChatFormat]:
    """The generation engine, tokenizer and chat format for ``policy`` (and ``checkpoint``)."""
    if policy in REFERENCE and checkpoint:
        raise ValueError(f"the reference policy {policy!r} has no weights: drop --checkpoint or pick a model policy")
    tok_source = "tiny" if policy in REFERENCE else policy
    model: Any = None
    if checkpoint and not checkpoint.endswith(".ckpt"):
        tokenizer_here = (Path(checkpoint) / "tokenizer_config.json").exists()
        tok_source = checkpoint if tokenizer_here else tok_source
        model = load_model(PolicySpec(checkpoint, seed=seed))
    elif checkpoint:
        model = load_checkpoint(PolicySpec(policy, seed=seed), checkpoint)
    elif policy not in REFERENCE:
        model = load_model(PolicySpec(policy, seed=seed))
    tokenizer = load_tokenizer(tok_source)
    fmt = make_format(tokenizer, tool_style=tool_style)  # type: ignore[arg-type]
    if model is None:
        return REFERENCE[policy](tokenizer, stop_ids(tokenizer, fmt)), tokenizer, fmt
    return make_engine(model.eval(), tokenizer, fmt), tokenizer, fmt


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
            turns.append(ToolTurn(response, ids, [0.0] * len(ids)))
        return turns


# --- printing ----------------------------------------------------------------------------------
def segments(ep: Episode) -> list[tuple[int, list[int]]]:
    """The episode as runs of consecutive tokens with the same role: ``(role_id, ids)``."""
    runs: list[tuple[int, list[int]]] = []
    for tok, role in zip(ep.builder.ids, ep.builder.roles, strict=True):
        if runs and runs[-1][0] == role:
            runs[-1][1].append(tok)
        else:
            runs.append((role, [tok]))
    return runs


def _tool_line_name(line: str) -> str:
    """The tool name of one line of a tool block (a JSON schema, or a compact signature)."""
    try:
        obj = json.loads(line)
        return str(obj.get("function", obj).get("name", "?"))
    except (json.JSONDecodeError, AttributeError):
        return line.split("(")[0].strip()


def _shorten_tools(text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        names = [_tool_line_name(line) for line in m.group(1).splitlines() if line.strip()]
        return f"<tools> … {len(names)} tools: {', '.join(names)} … </tools>"

    return _TOOLS_BLOCK.sub(repl, text)


def transcript(ep: Episode, tokenizer: Any) -> str:
    """Every segment of the episode, each line tagged with its role; long context shortened."""
    system_len = len(ep.builder.encode(ep.builder.fmt.system(ep.task.system_prompt, ep.task.tools)))
    prompt = ep.task.system_prompt.strip().split("\n")[0]
    prompt = f"prompt {prompt[:80] + ('…' if len(prompt) > 80 else '')!r}; " if prompt else ""
    names = ", ".join(tool_name(t) for t in ep.task.tools)
    lines = [f"[context] <system turn: {system_len} tokens; {prompt}{len(ep.task.tools)} tools: {names}>"]
    pos = 0
    for role, ids in segments(ep):
        start = max(0, system_len - pos)  # the system turn is summarised above
        pos += len(ids)
        if start >= len(ids):
            continue
        text = tokenizer.decode(ids[start:], skip_special_tokens=False)
        if role == ROLE_IDS["context"]:
            text = _shorten_tools(text)
        tag = TAGS[role]
        keep = [line for line in text.strip("\n").split("\n") if line or role != ROLE_IDS["context"]]
        lines += [f"{tag} {line}".rstrip() for line in keep]
    return "\n".join(lines)


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


# --- the command -------------------------------------------------------------------------------
def rehearse(
    source: str = "bfcl-multi-turn",
    task_id: str | None = None,
    split: str = "all",
    path: str | None = None,
    policy: str = "smollm2-135m",
    checkpoint: str | None = None,
    tool_style: str = "compact",
    max_user_turns: int | None = 1,
    max_new_tokens: int = 128,
    rehearse_tokens: int = 128,
    seed: int = 0,
    real: bool = True,
) -> int:
    """Run one task with the policy acting and rehearsing, and print what happened.

    Args:
        source: the task source (``bfcl-multi-turn``, ``tau2``, ...).
        task_id: the task to run; the source's first task when omitted.
        split: the source's split (``train``, ``test`` or ``all``).
        path: the source's data path, when it needs one.
        policy: ``smollm2-135m`` (packaged), a hub id or folder, ``tiny`` (random), or the reference
            policies ``oracle`` / ``noop`` (no model).
        checkpoint: a ``save_pretrained`` folder, or a Lightning ``.ckpt`` whose ``policy.*`` weights
            are loaded into the model of ``policy``.
        tool_style: tool rendering in the system turn, ``compact`` or ``json``.
        max_user_turns: keep only the first user turns of the task (all when omitted).
        max_new_tokens: most tokens per act turn (reference policies are not limited).
        rehearse_tokens: most tokens per rehearsed tool turn.
        seed: sampling seed (and the ``tiny`` model's weights).
        real: run a real environment in lockstep and compare (when the task has one).

    Returns:
        0 (the exit status).
    """
    torch.manual_seed(seed)
    task = pick_task(source, split, path, task_id, max_user_turns)
    engine, tokenizer, fmt = load_actor(policy, checkpoint, tool_style, seed)
    reference = policy in REFERENCE
    responder = OracleRehearsal(fmt) if reference else PolicyRehearsal(rehearse_tokens)
    context = getattr(getattr(engine, "model", None), "config", None)
    limits = RolloutLimits(
        max_calls_per_step=16,
        max_new_tokens=4096 if reference else max_new_tokens,
        max_episode_tokens=100_000 if reference else int(getattr(context, "max_position_embeddings", 8192)),
    )
    lockstep = real and task.env is not None
    rollout = make_rollout(engine, tokenizer, fmt, responder, limits, lockstep=lockstep)
    began = time.perf_counter()
    ep = rollout.run([task], 1)[0]
    seconds = time.perf_counter() - began

    roles = ep.role_tokens()
    print(f"task {task.id} ({task.benchmark}/{task.category}), {len(task.user_turns)} user turn(s); "
          f"policy {policy}{f' + {checkpoint}' if checkpoint else ''}; "
          f"responder {type(responder).__name__}{' + lockstep real env' if lockstep else ''}")  # fmt: skip
    print("\n== transcript ==")
    print(transcript(ep, tokenizer))
    print(f"\n== rehearsed vs real ({len(ep.calls)} calls) ==")
    print(side_by_side(ep))
    print("\n== fidelity ==")
    print(fidelity_report(ep))
    reward = compute_reward(task, ep.trajectory())
    score = "masked" if reward.score is None else f"{reward.score:.3f}"
    details = json.dumps(reward.details, default=str)[:300]
    print(f"\nreward: {score} (success {reward.success}, {reward_name(task)}) {details}")
    print(f"episode: {ep.turn + 1} turn(s), {len(ep.calls)} calls, format errors {ep.format_errors}, "
          f"flags {sorted(ep.flags) or '-'}; tokens context {roles['context']} act {roles['act']} "
          f"rehearse {roles['rehearse']}; {seconds:.1f} s")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    """``envace rehearse [--options]`` (``--help`` lists them)."""
    from jsonargparse import CLI

    return int(CLI(rehearse, args=argv))
