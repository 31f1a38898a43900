"""The DataModule: length filter and turn cuts as the rollout sees them, seeded step order, grounded SFT
batches, device transfer, validation order, sources without an environment, and a Lightning fit."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jsonargparse
import lightning.pytorch as pl
import pytest
import torch

from envace.data.batch import StepBatch
from envace.data.datamodule import EnvACEDataModule, recorded_trajectory
from envace.data.grounding import ground
from envace.data.sources import SourceSpec, load_source
from envace.protocol.render import HermesFormat
from envace.protocol.tokens import PieceEncoder
from envace.types import Task

BASE = {"name": "bfcl-multi-turn", "split": "train", "categories": ["multi_turn_base"]}
MISS_FUNC = {"name": "bfcl-multi-turn", "split": "train", "categories": ["multi_turn_miss_func"]}


def make(tokenizer, **kw) -> EnvACEDataModule:
    kw = {"sources": [BASE], "tokenizer": "tiny", "tool_style": "compact", **kw}
    dm = EnvACEDataModule(**kw)
    assert dm.encoder.tokenizer is tokenizer  # the packaged tokenizer of the fixture, shared
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def dm(tokenizer) -> EnvACEDataModule:
    return make(tokenizer, max_user_turns=2, tasks_per_step=3, sft_batch_size=2, limit=20)  # as in the seed test


def ids(batches: list[StepBatch]) -> list[list[str]]:
    return [[t.id for t in b.tasks] for b in batches]


def test_prompt_tokens_are_the_rollout_prefix(tokenizer) -> None:
    """The counted prompt is the system turn with the tools and the first user turn, tokenised piecewise."""
    dm = EnvACEDataModule([BASE], tokenizer="tiny", tool_style="compact")
    enc, fmt = PieceEncoder(tokenizer), HermesFormat(tool_style="compact")
    for task in load_source(**{k: v for k, v in BASE.items() if k != "name"}, name="bfcl-multi-turn")[:5]:
        expected = len(enc(fmt.system(task.system_prompt, task.tools))) + len(enc(fmt.user(task.user_turns[0])))
        assert dm.prompt_tokens(task) == expected


def test_max_prompt_tokens_keeps_exactly_the_fitting_tasks(tokenizer) -> None:
    everything = make(tokenizer, warm_start=False)
    lengths = {t.id: everything.prompt_tokens(t) for t in everything.train_set}
    cap = sorted(lengths.values())[len(lengths) // 2]
    dm = make(tokenizer, warm_start=False, max_prompt_tokens=cap)
    kept = [t.id for t in dm.train_set]
    assert kept == [i for i, n in lengths.items() if n <= cap]  # source order, nothing else dropped
    assert 0 < len(kept) < len(lengths)
    assert all(dm.prompt_tokens(t) <= cap for t in dm.train_set)
    assert dm.counts["train_filtered_by_length"] == len(lengths) - len(kept)
    assert dm.stats()["prompt_tokens"]["train"]["max"] <= cap


def test_max_user_turns_cuts_turns_gold_and_added_tools_together(tokenizer) -> None:
    originals = {t.id: t for t in load_source("bfcl-multi-turn", "train", categories=["multi_turn_miss_func"])}
    dm = make(tokenizer, sources=[MISS_FUNC], max_user_turns=2, limit=12)
    assert dm.counts["train_truncated"] > 0
    for task in dm.train_set:
        orig = originals[task.id]
        k = min(2, len(orig.user_turns))
        assert task.user_turns == orig.user_turns[:k] and task.gold == orig.gold[:k]
        assert task.extra["ground_truth"] == orig.extra["ground_truth"][:k]
        assert all(int(turn) < k for turn in task.tools_added)
        assert ("truncated_from" in task.extra) == (len(orig.user_turns) > 2)
        assert sum(m.role == "user" for m in ground(task).messages) == k
    assert any(int(t) >= 2 for o in originals.values() for t in o.tools_added)  # something was there to cut
    assert all(len(t.user_turns) == len(t.gold) for t in originals.values())  # the source tasks are untouched


def test_first_turns_keeps_the_recorded_calls_of_kept_turns(tmp_path: Path) -> None:
    task = load_source("chatlog", path=str(_chatlog(tmp_path)))[0]
    cut = task.first_turns(1)
    assert [r.call for r in cut.recorded] == [c for c in cut.gold[0]] and len(task.recorded) == 3
    assert "final_response" not in cut.extra and task.first_turns(5) is task


def test_same_seed_same_batches_other_seed_other_order(tokenizer, dm: EnvACEDataModule) -> None:
    kw = {"max_user_turns": 2, "tasks_per_step": 3, "sft_batch_size": 2, "limit": 20}
    first = list(dm.train_dataloader())
    again = list(make(tokenizer, **kw).train_dataloader())
    other = list(make(tokenizer, **kw, seed=1).train_dataloader())
    assert ids(first) == ids(again)
    assert all(torch.equal(a.sft.input_ids, b.sft.input_ids) for a, b in zip(first, again, strict=True))
    assert ids(first) != ids(other)
    assert len(first) == math.ceil(20 / 3) == len(dm.train_dataloader())
    assert all(len(b.tasks) == 3 for b in first)  # the last step wraps around
    assert {i for step in ids(first) for i in step} == {t.id for t in dm.train_set}  # an epoch covers every task
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(1)
    assert ids(list(loader)) != ids(first)  # a new epoch, a new order


def test_the_data_order_follows_seed_everything_unless_a_seed_is_given(tokenizer, dm, monkeypatch) -> None:
    """Runs of different ``seed_everything`` see their data in different orders (else a supervised
    control's seeds are one run, as in bfcl_cpu); an explicit ``data.seed`` still wins."""
    from lightning.pytorch import seed_everything

    kw = {"max_user_turns": 2, "tasks_per_step": 3, "sft_batch_size": 2, "limit": 20}
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    unset = ids(list(dm.train_dataloader()))
    seed_everything(0)
    assert ids(list(dm.train_dataloader())) == unset
    seed_everything(1)
    assert ids(list(dm.train_dataloader())) != unset
    assert ids(list(make(tokenizer, **kw, seed=0).train_dataloader())) == unset


def test_sft_batches_carry_act_and_rehearse_tokens(dm: EnvACEDataModule, tokenizer) -> None:
    batch = next(iter(dm.train_dataloader()))
    sft = batch.sft
    assert sft is not None and sft.input_ids.shape[0] == 2
    assert (sft.roles == 1).any() and (sft.roles == 2).any()
    assert torch.equal(sft.loss_mask, ((sft.roles != 0) & (sft.attention_mask == 1)).float())
    pad = sft.attention_mask == 0
    assert torch.all(sft.input_ids[pad] == tokenizer.pad_token_id)
    assert dm.counts["grounded"] == dm.counts["sft_episodes"] == len(dm.episodes) == 20


def test_transfer_moves_sft_tensors_and_keeps_tasks(dm: EnvACEDataModule) -> None:
    batch = next(iter(dm.train_dataloader()))
    moved = dm.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert isinstance(moved, StepBatch) and moved.tasks is batch.tasks
    assert all(t.device.type == "meta" for t in moved.sft)
    assert dm.transfer_batch_to_device(StepBatch(batch.tasks), torch.device("meta"), 0).sft is None


def test_val_loader_is_deterministic_and_spread_over_the_source(tokenizer) -> None:
    val = [{"name": "bfcl-multi-turn", "split": "test", "options": {"categories": ["multi_turn_base"]}}]
    dm = make(tokenizer, val_sources=val, val_tasks=7, tasks_per_step=3, warm_start=False, limit=3)
    batches = list(dm.val_dataloader())
    assert ids(batches) == ids(list(dm.val_dataloader()))
    assert [len(b.tasks) for b in batches] == [3, 3, 1] and all(b.sft is None for b in batches)
    source = load_source("bfcl-multi-turn", "test", categories=["multi_turn_base"])
    expected = [source[(i * len(source)) // 7].id for i in range(7)]  # evenly spaced, in source order
    assert [i for step in ids(batches) for i in step] == expected


def test_no_warm_start_and_max_sft_tokens(tokenizer) -> None:
    assert next(iter(make(tokenizer, warm_start=False, limit=4).train_dataloader())).sft is None
    dm = make(tokenizer, max_user_turns=1, limit=10, max_sft_tokens=700)
    assert all(len(e.input_ids) <= 700 for e in dm.episodes)
    assert dm.counts["sft_dropped_long"] + len(dm.episodes) == 10 and dm.counts["sft_dropped_long"] > 0


def test_vitabench_loads_without_grounding(tokenizer, vitabench_data: Path) -> None:
    source = {"name": "vitabench", "split": "all", "path": str(vitabench_data), "domains": ["delivery"]}
    dm = make(tokenizer, sources=[source], tasks_per_step=4, limit=8)
    assert len(dm.train_set) == 8 and all(t.benchmark == "vitabench" and t.env is None for t in dm.train_set)
    assert dm.counts["ground_skipped_no_env"] == 8 and dm.episodes == []
    assert all(b.sft is None for b in dm.train_dataloader())
    assert dm.stats()["prompt_tokens"]["train"]["min"] > 100


def _chatlog(tmp_path: Path) -> Path:
    def call(cid: str, name: str, args: dict) -> dict:
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}

    tools = [{"type": "function", "function": {"name": "quote", "parameters": {"type": "object", "properties": {}}}}]
    messages = [
        {"role": "user", "content": "Price of X and Y?"},
        {"role": "assistant", "tool_calls": [call("c1", "quote", {"s": "X"}), call("c2", "quote", {"s": "Y"})]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"price": 1}'},
        {"role": "tool", "tool_call_id": "c2", "content": '{"price": 2}'},
        {"role": "user", "content": "And Z?"},
        {"role": "assistant", "tool_calls": [call("c3", "quote", {"s": "Z"})]},
        {"role": "tool", "tool_call_id": "c3", "content": '{"price": 3}'},
        {"role": "assistant", "content": "Z is 3."},
    ]
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"id": "a", "tools": tools, "messages": messages}) + "\n")
    return path


def test_chat_logs_warm_start_from_their_recorded_responses(tmp_path: Path, tokenizer) -> None:
    dm = make(tokenizer, sources=[{"name": "chatlog", "split": "all", "path": str(_chatlog(tmp_path))}])
    assert dm.counts["recorded"] == 1 and len(dm.episodes) == 1
    traj = recorded_trajectory(dm.train_set[0])
    assert [json.loads(m.content) for m in traj.messages if m.role == "tool"] == [{"price": p} for p in (1, 2, 3)]
    assert traj.messages[-1].content == "Z is 3."
    unanswered = Task("u", "chatlog", user_turns=["q"], gold=[[traj.calls[0].call]], recorded=[])
    assert recorded_trajectory(unanswered) is None


def test_sources_are_written_flat_or_nested_in_yaml() -> None:
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(EnvACEDataModule, "data")
    cfg = parser.parse_string(
        "data:\n  sources:\n    - {name: bfcl-multi-turn, split: train, categories: [multi_turn_base]}\n"
        "    - {name: tau2, options: {domains: [airline]}}\n  tasks_per_step: 4\n"
    )
    dm = parser.instantiate(cfg).data
    assert dm.sources == [
        SourceSpec("bfcl-multi-turn", "train", None, {"categories": ["multi_turn_base"]}),
        SourceSpec("tau2", "train", None, {"domains": ["airline"]}),
    ]
    assert dm.tasks_per_step == 4
    with pytest.raises(ValueError, match="name"):
        SourceSpec.parse({"split": "train"})


class _Recorder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[StepBatch] = []

    def training_step(self, batch: StepBatch, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch)
        return (self.w * batch.sft.loss_mask.sum()).sum() + self.w.square().sum()

    def validation_step(self, batch: StepBatch, batch_idx: int) -> None:
        self.seen.append(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_lightning_fit_receives_step_batches(tokenizer) -> None:
    val = [{"name": "bfcl-multi-turn", "split": "test", "categories": ["multi_turn_base"]}]
    dm = EnvACEDataModule([BASE], val, tokenizer="tiny", tool_style="compact", max_user_turns=1, limit=4, val_tasks=2)
    module = _Recorder()
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, val_check_interval=2,
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    train = [b for b in module.seen if b.sft is not None]
    assert len(train) == 3 and all(isinstance(b, StepBatch) and len(b.tasks) == 1 for b in module.seen)
    assert any(len(b.tasks) == 1 and b.sft is None for b in module.seen)  # validation ran


class _Sharded(_Recorder):
    def configure_model(self) -> None:  # ModelParallelStrategy asks for it
        pass


@pytest.fixture()
def launcher_state_restored():
    """A one-process FSDP fit sets the launcher's variables (``LOCAL_RANK``, ``MASTER_PORT``, ...) in this
    process and leaves a process group: a later test that forks or spawns workers would take itself for
    a launched rank (the two-process FSDP test then waits for a peer that never starts). Undone here."""
    saved = dict(os.environ)
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def test_fsdp_on_one_device_in_bf16_true_receives_step_batches(tokenizer, launcher_state_restored) -> None:
    """FSDP2 on one process (the GPU check's fit): Lightning re-creates the training loader around a
    DistributedSampler, which a resumable StepLoader cannot take; ``bf16-true`` converts the batch,
    whose tasks must come through as they are."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    dm = EnvACEDataModule([BASE], [], tokenizer="tiny", tool_style="compact", max_user_turns=1, limit=4)
    module = _Sharded()
    trainer = pl.Trainer(
        max_steps=2, accelerator="cpu", devices=1, precision="bf16-true", logger=False, enable_checkpointing=False,
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1), enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, datamodule=dm)
    assert len(module.seen) == 2 and all(isinstance(b, StepBatch) and isinstance(b.tasks[0], Task) for b in module.seen)
    assert all(b.sft is not None and b.sft.loss_mask.dtype == torch.float32 for b in module.seen)


def test_rl_share_gives_rl_and_the_warm_start_disjoint_scenarios(tokenizer) -> None:
    """A warm start supervised on the tasks RL then samples has memorised them: with ``rl_share`` RL
    rolls out only a share of the scenarios and the warm start is grounded on the others only, every
    category of a scenario on the same side; 0 keeps every task on both sides."""
    from envace.data.pools import family_of

    both = make(tokenizer, max_user_turns=1, limit=12)
    assert both.counts["grounded"] == len(both.train_set) == 12
    split = make(tokenizer, max_user_turns=1, limit=12, rl_share=0.5)
    rl = {family_of(t.id) for t in split.train_set}
    grounded = {family_of(t.id) for t in both.train_set} - rl
    assert len(rl) == 6 and len(grounded) == 6
    assert split.counts["grounded"] == 12 - len(split.train_set) and split.counts["rl_tasks"] == len(split.train_set)
    again = make(tokenizer, max_user_turns=1, limit=12, rl_share=0.5, seed=7)  # another seed: the same pools
    assert [t.id for t in again.train_set] == [t.id for t in split.train_set]
    with pytest.raises(ValueError, match="rl_share must be a fraction"):
        make(tokenizer, max_user_turns=1, limit=4, rl_share=1.0)


def test_training_batches_carry_rl_pool_and_validation_batches_none(tokenizer) -> None:
    """Dynamic sampling draws from the pool the training batches carry: RL's own tasks (with ``rl_share``,
    not the warm start's; never the validation tasks) and the data seed; validation batches carry none."""
    val = {"name": "bfcl-multi-turn", "split": "test", "categories": ["multi_turn_base"]}
    dm = make(tokenizer, val_sources=[val], val_tasks=2, max_user_turns=1, limit=12, rl_share=0.5, seed=5)
    batch = next(iter(dm.train_dataloader()))
    assert batch.pool is not None and batch.pool.seed == dm.data_seed == 5
    pool = {t.id for t in batch.pool.tasks}
    assert pool == {t.id for t in dm.train_set} and len(pool) == dm.counts["rl_tasks"] < 12  # RL's share only
    assert not pool & {t.id for t in dm.val_set}
    assert dm.transfer_batch_to_device(batch, torch.device("meta"), 0).pool is batch.pool
    assert all(b.pool is None for b in dm.val_dataloader())
