"""Every training arm does what its name says (configs/arms/, docs/training.md "The arms"): a fit of the
smoke config with each arm's overlay, observed from outside — who wrote each tool turn, which weights
received a gradient, which are in the optimizer, which changed."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

from envace.cli import lightning_cli
from envace.data.batch import collate_episodes
from envace.losses import LossInputs
from envace.modules import EnvACEModule
from envace.modules.logprobs import selected_logprobs
from envace.protocol.tokens import PieceEncoder
from envace.rewards import RewardOutput
from envace.rollout import PolicyRehearsal, Responder, Rollout
from envace.rollout.reference import OracleEngine
from envace.types import ROLE_IDS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # real fits of the smoke config, seconds each
LORA = "{r: 4, target_modules: [q_proj, v_proj]}"
WARM = 2  # the smoke config's warm-start steps; steps 2 and 3 are RL


class Probe(pl.Callback):
    """Records, per optimizer step, the parameters with a non-zero gradient; per RL step, the episodes."""

    def __init__(self) -> None:
        self.grads: dict[int, set[str]] = {}
        self.episodes: dict[int, list[Any]] = {}
        self.optimized: set[str] = set()
        self.at: dict[str, dict[str, torch.Tensor]] = {}

    def snapshot(self, module: pl.LightningModule, when: str) -> None:
        self.at[when] = {n: p.detach().clone() for n, p in module.named_parameters()}

    def on_fit_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.snapshot(module, "start")
        ids = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
        self.optimized = {n for n, p in module.named_parameters() if id(p) in ids}

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, batch: Any, i: int) -> None:
        if trainer.global_step == WARM:  # callbacks run before the module's hook: the warm start's end
            self.snapshot(module, "warm")

    def on_before_optimizer_step(self, trainer: pl.Trainer, module: pl.LightningModule, optimizer: Any) -> None:
        grads = {n for n, p in module.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
        self.grads[trainer.global_step] = grads

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, out: Any, batch: Any, i: int):
        if isinstance(out, dict) and "episodes" in out:
            self.episodes[trainer.global_step - 1] = out["episodes"]  # the step has been taken

    def on_fit_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.snapshot(module, "end")


def oracle_acts(self: EnvACEModule, responder: Responder, lockstep: bool = False) -> Rollout:
    """The module's rollout with the gold calls as its acts: a 2-layer random model writes no call in
    16 tokens, so this gives every episode tool turns. Everything after the act is the arm's own: who
    answers each call, with which engine, and where the loss sends each token's gradient."""
    if type(responder) is PolicyRehearsal and responder.engine is None:
        responder = PolicyRehearsal(self.engine)  # the policy rehearses, not the oracle
    oracle = OracleEngine(self.tokenizer, self.engine.stop_ids)
    return Rollout(oracle, self.fmt, PieceEncoder(self.tokenizer), responder, self.limits, lockstep=lockstep,
                   validate_calls=False)  # fmt: skip


def fit_arm(
    tmp: Path,
    arm: str,
    monkeypatch: pytest.MonkeyPatch,
    *extra: str,
    ckpt: Path | None = None,
    steps: int = 4,
    reward: Any = None,
) -> tuple[EnvACEModule, Probe]:
    """Fit the smoke config (2 warm-start + 2 RL steps, LoRA, no validation) with ``arm``'s overlay,
    the gold calls acting (:func:`oracle_acts`). Rewards alternate 0, 1 within each group, so every RL
    step has a non-zero advantage (the random tiny model would score 0 everywhere)."""
    scores = itertools.cycle([0.0, 1.0])
    monkeypatch.setattr(EnvACEModule, "reward", reward or (lambda self, ep: RewardOutput(next(scores), False)))
    monkeypatch.setattr(EnvACEModule, "rollout", oracle_acts)
    before = os.getcwd()
    os.chdir(tmp)
    try:
        args = ["--config", str(ROOT / "configs/smoke.yaml"), "--config", str(ROOT / f"configs/arms/{arm}.yaml"),
                "--model.init_args.policy.lora", LORA, "--trainer.limit_val_batches", "0",
                "--model.init_args.limits.max_new_tokens", "512", "--trainer.max_steps", str(steps),
                *extra]  # fmt: skip
        cli = lightning_cli(args, run=False)
        probe = Probe()
        cli.trainer.callbacks.append(probe)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt)
    finally:
        os.chdir(before)
    assert cli.trainer.global_step == steps
    return cli.model, probe


def names(module: EnvACEModule, prefix: str) -> set[str]:
    return {n for n, p in module.named_parameters() if n.startswith(prefix) and "lora_" in n}


def rl_episodes(probe: Probe) -> list[Any]:
    return [ep for step in sorted(probe.episodes) for ep in probe.episodes[step]]


def called(episodes: list[Any]) -> list[Any]:
    out = [ep for ep in episodes if ep.calls]
    assert out, "no episode made a call: nothing to check"
    return out


def test_envace_one_set_of_weights_writes_and_learns_both_roles(tmp_path, monkeypatch) -> None:
    module, probe = fit_arm(tmp_path, "envace", monkeypatch)
    assert module.simulator is None and set(probe.episodes) == {WARM, WARM + 1}
    for ep in called(rl_episodes(probe)):
        assert set(ep.writers) == {"policy"} and ep.role_tokens()["rehearse"] > 0
    policy = names(module, "policy.")
    assert probe.optimized == policy
    for step in (WARM, WARM + 1):
        assert probe.grads[step] and probe.grads[step] <= policy


def test_real_env_responses_are_the_environments_and_context(tmp_path, monkeypatch) -> None:
    module, probe = fit_arm(tmp_path, "real_env", monkeypatch)
    for ep in called(rl_episodes(probe)):
        assert set(ep.writers) == {"environment"} and ep.role_tokens()["rehearse"] == 0
    assert probe.optimized == names(module, "policy.") and probe.grads[WARM + 1]


def test_simulator_is_the_frozen_warm_start_and_never_trained(tmp_path, monkeypatch) -> None:
    module, probe = fit_arm(tmp_path, "simulator", monkeypatch)
    sim, policy = names(module, "simulator."), names(module, "policy.")
    assert sim and probe.optimized == policy  # the simulator is not in the optimizer
    for ep in called(rl_episodes(probe)):
        assert set(ep.writers) == {"simulator"} and ep.role_tokens()["rehearse"] == 0  # its tokens are context
    for step in (WARM, WARM + 1):
        assert probe.grads[step] and probe.grads[step] <= policy
    warm, end, start = probe.at["warm"], probe.at["end"], probe.at["start"]
    for n in sim:  # the policy's weights at the end of the warm start, bit for bit, and never changed since
        assert torch.equal(end[n], warm[n.replace("simulator.", "policy.", 1)]), n
    assert any(not torch.equal(start[n], end[n]) for n in sim)  # not the initial weights
    assert any(not torch.equal(warm[n], end[n]) for n in policy)  # while the policy went on learning
    base = [n for n, _ in module.simulator.named_parameters() if "lora_" not in n]
    shared = dict(module.policy.named_parameters())
    assert all(module.simulator.get_parameter(n) is shared[n] for n in base)  # one frozen base in memory


def test_separate_each_role_trains_only_its_own_weights(tmp_path, monkeypatch) -> None:
    module, probe = fit_arm(tmp_path, "separate", monkeypatch)
    sim, policy = names(module, "simulator."), names(module, "policy.")
    assert probe.optimized == sim | policy
    for step in range(4):  # warm start and RL alike: both sets move
        assert probe.grads[step] & sim and probe.grads[step] & policy
    episodes = called(rl_episodes(probe))
    for ep in episodes:
        assert set(ep.writers) == {"simulator"} and ep.role_tokens()["rehearse"] > 0
    # each role's tokens alone: act tokens reach only the policy's weights, rehearse tokens only the simulator's
    tokens = collate_episodes([e.tensors() for e in episodes], module.engine.pad_id)
    for role, own, other in (("act", policy, sim), ("rehearse", sim, policy)):
        module.zero_grad(set_to_none=True)
        lp = module._logprobs(tokens)
        (lp * (tokens.roles == ROLE_IDS[role])).sum().backward()
        got = {n for n, p in module.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
        assert got & own and not got & other, role


def test_sft_only_never_rolls_out(tmp_path, monkeypatch) -> None:
    module, probe = fit_arm(tmp_path, "sft_only", monkeypatch)
    assert not probe.episodes and all(probe.grads[s] for s in range(4))
    assert module.lr_factor(3) == 1.0  # the warm start's rate throughout


@pytest.mark.parametrize(("arm", "silent"), [("act_loss_only", "rehearse"), ("rehearse_loss_only", "act")])
def test_loss_only_ablations_are_self_rehearsal_with_one_role_silent(tmp_path, monkeypatch, arm, silent) -> None:
    """The policy still writes every response (shared weights); the silenced role's tokens get exactly
    zero gradient from the RL loss, the other role's do not."""
    module, probe = fit_arm(tmp_path, arm, monkeypatch)
    episodes = called(rl_episodes(probe))
    assert all(set(ep.writers) == {"policy"} and ep.role_tokens()["rehearse"] > 0 for ep in episodes)
    tokens = collate_episodes([e.tensors() for e in episodes], module.engine.pad_id)
    lp = tokens.logprobs.clone().requires_grad_(True)
    groups = torch.tensor([e.group for e in episodes])
    rewards = torch.tensor([float(i % 2) for i in range(len(episodes))])
    inputs = LossInputs(lp, tokens.logprobs, tokens.roles, tokens.loss_mask, rewards, groups, None)
    module.loss(inputs)[0].backward()
    assert lp.grad is not None
    spoken = "act" if silent == "rehearse" else "rehearse"
    assert lp.grad[tokens.roles == ROLE_IDS[silent]].abs().max() == 0
    assert lp.grad[tokens.roles == ROLE_IDS[spoken]].abs().max() > 0


def test_a_resumed_simulator_run_keeps_the_frozen_snapshot(tmp_path, monkeypatch) -> None:
    """The simulator's weights and its snapshot flag are in the checkpoint (LoRA: its adapters only, the
    shared base rebuilt); a resumed run goes on with the same frozen simulator, not a fresh copy."""
    module, _ = fit_arm(tmp_path, "simulator", monkeypatch)
    last = next(tmp_path.rglob("last.ckpt"))
    ckpt = torch.load(last, weights_only=True)
    sim = {k for k in ckpt["state_dict"] if k.startswith("simulator.")}
    assert sim == names(module, "simulator.") and ckpt["envace"]["simulator_ready"]
    resumed, probe = fit_arm(tmp_path, "simulator", monkeypatch, ckpt=last, steps=5)
    for n in sim:
        assert torch.equal(resumed.get_parameter(n), module.get_parameter(n)), n
    assert probe.episodes and all(set(ep.writers) == {"simulator"} for ep in called(rl_episodes(probe)))


def test_the_kl_reference_is_the_frozen_warm_start_not_the_base(tmp_path, monkeypatch) -> None:
    """The reference of the KL term (and of the ``train/rl/kl`` curve) is the policy as RL begins, a
    frozen copy of its adapters over the shared base, kept in the checkpoint; the base model (adapters
    disabled) writes no call at 135M, so a KL to it would pull the policy away from tool use."""
    module, probe = fit_arm(tmp_path, "envace", monkeypatch)
    ref, policy = names(module, "reference."), names(module, "policy.")
    assert ref and probe.optimized == policy  # frozen: not in the optimizer
    warm, end = probe.at["warm"], probe.at["end"]
    for n in ref:
        assert torch.equal(end[n], warm[n.replace("reference.", "policy.", 1)]), n
    assert any(not torch.equal(warm[n], end[n]) for n in policy)
    tokens = collate_episodes([e.tensors() for e in called(rl_episodes(probe))], module.engine.pad_id)
    with module.policy.disable_adapter():
        base = module._logprobs(tokens)
    mask = tokens.loss_mask.bool()
    ref_lp = module.reference_logprobs(tokens)  # each group's shared prefix run once
    assert not torch.allclose(ref_lp[mask], base[mask])
    assert torch.allclose(ref_lp[mask], selected_logprobs(module.reference, tokens)[mask], atol=1e-4)
    ckpt = torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=True)
    assert {k for k in ckpt["state_dict"] if k.startswith("reference.")} == ref and ckpt["envace"]["reference_ready"]
    (tmp_path / "base").mkdir()
    based, _ = fit_arm(tmp_path / "base", "envace", monkeypatch, "--model.init_args.kl_reference", "base")
    assert based.reference is None


def test_dynamic_sampling_replaces_groups_without_reward_variance(tmp_path, monkeypatch) -> None:
    """DAPO's dynamic sampling: a group whose rewards are all equal (no gradient) is replaced by a fresh
    training task's group whose rewards vary; the step's cost counts every episode sampled."""
    from envace.modules.envace import flat_groups

    turns = itertools.count()

    def reward(self, ep) -> RewardOutput:  # tasks whose index is 0 mod 4 never vary; the others alternate 0, 1
        if int(ep.task.id.rsplit("_", 1)[1]) % 4 == 0:
            return RewardOutput(1.0, True)
        return RewardOutput(float(next(turns) % 2), False)

    steps = []
    rl_step = EnvACEModule.rl_step

    def spy(self, batch):
        out = rl_step(self, batch)
        steps.append(([r.score for r in out["rewards"]], [e.group for e in out["episodes"]], out["rollout"].episodes))
        drawn.update(e.task.id for e in out["episodes"])
        return out

    drawn: set[str] = set()
    monkeypatch.setattr(EnvACEModule, "rl_step", spy)
    module, _ = fit_arm(tmp_path, "real_env", monkeypatch, "--model.init_args.dynamic_sampling", "4",
                        "--data.tasks_per_step", "2", "--model.init_args.group_size", "4", reward=reward)  # fmt: skip
    assert drawn <= {t.id for t in module.trainer.datamodule.train_set}  # the replacements: RL's training tasks
    assert len(steps) == 2
    for scores, groups, _ in steps:
        assert len(scores) == 8 and groups == [0] * 4 + [1] * 4
        assert flat_groups(scores, 4) == []  # every group of the step carries signal
    assert sum(sampled for *_, sampled in steps) > 16  # flat groups were sampled, counted, and replaced
