"""Fingerprints of rolled-out episodes for fixed seeds: run before and after a refactor of the rollout
and compare (``--compare``). Every setting uses a tiny random model (``tiny``) or a scripted policy
over BFCL multi-turn tasks, with fixed per-episode seeds; an episode's fingerprint covers its token
ids, roles, log-probs (to 1e-4), flags, messages and calls.

    python scripts/episode_fingerprint.py --out /tmp/before.json
    python scripts/episode_fingerprint.py --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

import torch

from envace.data.sources import load_source
from envace.policy import PolicySpec, load_model, load_tokenizer
from envace.protocol.render import HermesFormat
from envace.rollout import (
    ExternalSimulator,
    PolicyRehearsal,
    RealEnvironment,
    RolloutLimits,
    SamplingConfig,
    make_engine,
    make_rollout,
)
from envace.rollout.reference import OracleEngine

FMT = HermesFormat(tool_style="compact")
SEEDS = [11, 12, 13, 14]
RESPONSE_TOKENS, IMAGINED_RESPONSE_TOKENS = 16, 128
NEW_API = "max_rehearse_tokens" in RolloutLimits.__dataclass_fields__  # one budget for every generated response
LIMITS = RolloutLimits(max_steps_per_turn=2, max_new_tokens=64, max_episode_tokens=2400)
if NEW_API:
    LIMITS = RolloutLimits(max_steps_per_turn=2, max_new_tokens=64, max_episode_tokens=2400,
                           max_rehearse_tokens=RESPONSE_TOKENS)  # fmt: skip


PROMPT_ARG = "prompt" in ExternalSimulator.__init__.__code__.co_varnames  # inline by default since the arms issue


def rehearsal(engine: Any = None) -> Any:
    return PolicyRehearsal(engine=engine) if NEW_API else PolicyRehearsal(RESPONSE_TOKENS, engine=engine)


def simulator(engine: Any, tok: Any) -> Any:
    if PROMPT_ARG:
        return ExternalSimulator(engine, tokenizer=tok, prompt="separate")  # the simulator prompt, as before
    if NEW_API:
        return ExternalSimulator(engine=engine, tokenizer=tok)
    return ExternalSimulator(max_new_tokens=RESPONSE_TOKENS, engine=engine, tokenizer=tok)


def episode_record(ep: Any) -> dict[str, Any]:
    roles = [int(r) for r in ep.builder.roles]
    logprobs = [round(float(x), 4) for x in ep.builder.logprobs]
    messages = [[m.role, m.content, m.name, [c.to_dict() for c in (m.tool_calls or [])]] for m in ep.messages]
    body = {"ids": ep.ids, "roles": roles, "logprobs": logprobs, "flags": sorted(ep.flags), "messages": messages,
            "turn": ep.turn, "format_errors": ep.format_errors}  # fmt: skip
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"digest": digest, "tokens": len(ep.ids), "ids": ep.ids, "flags": sorted(ep.flags)}


def imagination(engine: Any, tok: Any, mode: str, n: int) -> Any:
    if NEW_API:
        from dataclasses import replace

        from envace.inference import ImaginationConfig, imagining_rollout

        limits = replace(LIMITS, max_rehearse_tokens=IMAGINED_RESPONSE_TOKENS)
        return imagining_rollout(engine, tok, FMT, RealEnvironment(), limits, ImaginationConfig(mode, n))
    else:
        from envace.inference import RehearsalConfig, RehearsingRollout
        from envace.protocol.tokens import PieceEncoder

        return RehearsingRollout(engine, FMT, PieceEncoder(tok), RealEnvironment(), LIMITS,
                                 rehearsal=RehearsalConfig(mode, n))  # fmt: skip


def settings(tok: Any) -> dict[str, Any]:
    tasks = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])
    wanted = ("multi_turn_base_105", "multi_turn_base_146")
    tasks = [t for t in tasks if t.id in wanted]

    def model() -> Any:
        torch.manual_seed(0)
        return load_model(PolicySpec("tiny"))

    def engine(**kw: Any) -> Any:
        return make_engine(model(), tok, FMT, SamplingConfig(**kw))

    out: dict[str, Any] = {}
    out["rehearse_continuous"] = lambda: make_rollout(engine(), tok, FMT, rehearsal(), LIMITS)
    out["rehearse_lockstep_batches"] = lambda: make_rollout(engine(continuous=False), tok, FMT, rehearsal(),
                                                            LIMITS)  # fmt: skip
    out["rehearse_small_batches"] = lambda: make_rollout(engine(batch_size=3), tok, FMT, rehearsal(), LIMITS)
    out["real_env_lockstep"] = lambda: make_rollout(engine(), tok, FMT, RealEnvironment(), LIMITS, lockstep=True)
    out["oracle_rehearse"] = lambda: make_rollout(OracleEngine(tok, [tok.eos_token_id]), tok, FMT,
                                                  rehearsal(engine()), LIMITS, lockstep=True)  # fmt: skip
    out["oracle_real"] = lambda: make_rollout(OracleEngine(tok, [tok.eos_token_id]), tok, FMT, RealEnvironment(),
                                              LIMITS)  # fmt: skip
    out["oracle_simulator"] = lambda: make_rollout(OracleEngine(tok, [tok.eos_token_id]), tok, FMT,
                                                   simulator(engine(), tok),
                                                   LIMITS)  # fmt: skip
    out["imagine_parallel"] = lambda: imagination(engine(), tok, "parallel", 2)
    out["imagine_sequential"] = lambda: imagination(engine(), tok, "sequential", 2)
    out["imagine_oracle"] = lambda: imagination(OracleEngine(tok, [tok.eos_token_id]), tok, "parallel", 2)
    return {name: (make, tasks) for name, make in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare")
    args = ap.parse_args()
    tok = load_tokenizer("tiny")
    result: dict[str, Any] = {}
    for name, (make, tasks) in settings(tok).items():
        torch.manual_seed(1)  # the external simulator draws from the global stream
        episodes = make().run(tasks, group_size=2, seeds=SEEDS)
        result[name] = [episode_record(ep) for ep in episodes]
        digests = " ".join(r["digest"][:8] for r in result[name])
        print(f"{name:28s} {digests}  tokens {[r['tokens'] for r in result[name]]}")
    with open(args.out, "w") as f:
        json.dump(result, f)
    if not args.compare:
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    same = differ = 0
    for name, records in result.items():
        for i, (a, b) in enumerate(zip(records, before.get(name, []), strict=False)):
            if a["digest"] == b["digest"]:
                same += 1
            else:
                differ += 1
                first = next((j for j, (x, y) in enumerate(zip(a["ids"], b["ids"], strict=False)) if x != y), None)
                print(f"DIFFERS {name}[{i}]: tokens {b['tokens']} -> {a['tokens']}, first differing id at {first}")
    print(f"{same} episodes identical, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
