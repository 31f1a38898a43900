"""ShopWorld's tasks: split sizes, strata in equal shares, disjoint i.i.d. splits the same in every
process, held-out products in test only, and the reward checked against the state-replay oracle."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from envace.data.sources import load_source, verify_source
from envace.data.sources.shopworld import SPLITS, STRATA
from envace.data.sources.shopworld_verify import oracle_success, perturbations
from envace.envs.shopworld import catalogue
from envace.rewards.gold import gold_calls
from envace.types import Message, Trajectory


def _key(t) -> str:
    return t.user_turns[0] + repr(t.gold)


@pytest.mark.parametrize("split", list(SPLITS))
def test_each_split_holds_every_stratum_in_equal_shares(split: str) -> None:
    tasks = load_source("shopworld", split=split)
    assert len(tasks) == SPLITS[split]
    counts = Counter(t.category for t in tasks)
    assert set(counts) == set(STRATA) and max(counts.values()) - min(counts.values()) <= 1


def test_splits_are_disjoint_and_held_out_products_are_in_test_only() -> None:
    by_split = {s: load_source("shopworld", split=s) for s in SPLITS}
    keys = {s: {_key(t) for t in ts} for s, ts in by_split.items()}
    for a in SPLITS:
        assert len(keys[a]) == SPLITS[a]  # no task twice within a split
        for b in SPLITS:
            assert a == b or not keys[a] & keys[b], (a, b)
    held = {p.sku for p in catalogue().values() if p.held_out}
    for split, tasks in by_split.items():
        shown = {c.arguments.get("sku") for t in tasks for c in t.gold[0]} | {
            o["sku"] for t in tasks for o in t.extra["metadata"].get("orders", [])
        }
        names = " ".join(t.user_turns[0] for t in tasks)
        unseen = [p for p in catalogue().values() if p.held_out and p.name in names]
        if split == "test":
            assert sum(t.extra["held_out"] for t in tasks) == 150  # half of S1-S3
        else:
            assert not shown & held and not unseen, split


def test_s3_needs_its_fallback_in_about_half_of_every_split() -> None:
    for split in SPLITS:
        s3 = [t for t in load_source("shopworld", split=split) if t.category == "S3_fallback"]
        needs = sum(len([c for c in t.gold[0] if c.name == "search_products"]) == 2 for t in s3)
        assert 0.35 < needs / len(s3) < 0.65, (split, needs, len(s3))


def test_the_tasks_are_the_same_in_another_process() -> None:
    code = (
        "from envace.data.sources import load_source; "
        "print([t.user_turns[0] for t in load_source('shopworld', split='tune')])"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert other.stdout.strip() == str([t.user_turns[0] for t in load_source("shopworld", split="tune")])


def test_the_reward_agrees_with_the_state_replay_oracle() -> None:
    report = verify_source("shopworld", split="all", limit=40)
    assert report.total > 1500 and report.passed == report.total, report.failures[:3]
    assert any(g.startswith("gold (oracle passes 160/160)") for g in report.per_group)
    assert any(g.startswith("wrong_sku (oracle passes 0/") for g in report.per_group)


def test_the_agreement_check_can_fail() -> None:
    """gold-calls, which also scores free reads, disagrees with the oracle once free reads are added."""
    rng = random.Random(0)
    tasks = load_source("shopworld", split="tune", limit=10)
    for task in tasks:
        calls = perturbations(task, rng)["free_reads_added"]
        assert calls is not None
        traj = Trajectory(task, [Message("user", task.user_turns[0]), Message("assistant", tool_calls=calls)])
        assert oracle_success(task, calls) and not gold_calls(task, traj).success


def test_no_answer_a_training_split_grounds_shows_a_held_out_product() -> None:
    """The warm start trains on the real answers to the gold calls: a held-out product must be in none
    of them (as a search's distractor, say), or the test's held-out tasks would be seen in training."""
    from envace.envs.shopworld import ShopWorld

    held = {p.sku for p in catalogue().values() if p.held_out}
    for split in ("sft", "rl", "tune"):
        for task in load_source("shopworld", split=split):
            world = ShopWorld()
            world.reset(**task.extra["metadata"])
            answers = [getattr(world, c.name)(**c.arguments) for c in task.gold[0]]
            assert not any(sku in str(answers) for sku in held), (task.id, answers)


def test_exploration_trains_the_rehearse_role_only_and_shows_no_held_out_product() -> None:
    """The fidelity knob's transitions: every assistant token is context (no act target), the real
    answers are rehearse targets, each ends off the gold's course, and none names a held-out product."""
    from envace.data.grounding import ground
    from envace.policy import load_tokenizer
    from envace.protocol.render import make_format
    from envace.protocol.tokens import PieceEncoder, encode_trajectory
    from envace.types import ROLE_IDS

    tok = load_tokenizer("tiny")
    fmt = make_format(tok, "hermes", "compact")
    held = {p.sku for p in catalogue().values() if p.held_out} | {p.name for p in catalogue().values() if p.held_out}
    explore = load_source("shopworld", split="explore", limit=60)
    assert len(explore) == 60 and all(t.extra["rehearse_only"] for t in explore)
    for task in explore:
        traj = ground(task)
        assert not any(h in str(traj.messages) for h in held), task.id
        tensors = encode_trajectory(traj, PieceEncoder(tok), fmt).tensors()
        assert ROLE_IDS["act"] not in tensors.roles.tolist() and ROLE_IDS["rehearse"] in tensors.roles.tolist()
        assert task.extra["env_calls"] == len(task.gold[0])
    plain = dict(explore[0].extra, rehearse_only=False)  # the same episode without the flag trains its acts
    traj = ground(explore[0])
    traj.task.extra.update(plain)
    assert ROLE_IDS["act"] in encode_trajectory(traj, PieceEncoder(tok), fmt).tensors().roles.tolist()


def test_the_configs_validation_holds_every_stratum_in_equal_shares(tokenizer) -> None:
    """configs/shopworld.yaml's in-fit validation, selected as the DataModule selects it: the tune split
    cycles its strata, so 40 tasks spread evenly over its 200 (every fifth) were all S1_copy (the gate 1
    runs' validation curves read S1 only)."""
    from envace.commands.fit_config import load_fit_config
    from envace.data.datamodule import EnvACEDataModule

    data = load_fit_config(["--config", str(Path(__file__).resolve().parents[2] / "configs/shopworld.yaml")]).data
    keep = ("val_sources", "val_tasks", "max_prompt_tokens", "val_max_prompt_tokens")
    dm = EnvACEDataModule(data.sources, tokenizer="tiny", tool_style="compact", **{k: data[k] for k in keep})
    val = dm._load(dm.val_sources, "val", dm.val_tasks, dm.val_max_prompt_tokens)
    assert Counter(t.id.split("-")[3] for t in val) == dict.fromkeys(STRATA, 8)
