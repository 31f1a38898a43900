"""Memory notes in the warm start: the note is test time's (same text, same place), never in the loss,
seeded; its attempts are the gold in a random place beside a corrupted one whose error shows; off
(fraction 0) the warm start is token for token what it was."""

from __future__ import annotations

import random

import jsonargparse
import pytest
import torch

from envace.data.datamodule import EnvACEDataModule
from envace.data.grounding import NO_CALL_TEXT, ground
from envace.data.memory_notes import ATTEMPTS, imagined_attempts, noted, turn_attempts, turns, with_notes
from envace.data.sources import load_source
from envace.inference import Imagination, ImaginationConfig, render_memory
from envace.protocol.render import HermesFormat
from envace.protocol.tokens import EpisodeBuilder, PieceEncoder, encode_trajectory
from envace.rollout.episode import Episode
from envace.types import CallRecord, ToolCall, is_error

BASE = {"name": "bfcl-multi-turn", "split": "train", "categories": ["multi_turn_base"]}
MISS_PARAM = {"name": "bfcl-multi-turn", "split": "train", "categories": ["multi_turn_miss_param"]}
CD = {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}
TOOLS = [{"name": "cd", "parameters": CD}, {"name": "ls", "parameters": {"properties": {"a": {"type": "boolean"}}}}]
GOLD = [
    CallRecord(ToolCall("cd", {"folder": "docs"}), {"current_working_directory": "docs"}),
    CallRecord(ToolCall("ls", {}), {"current_directory_content": ["a.txt"]}),
]


@pytest.fixture(scope="module")
def trajs():
    """Grounded trajectories of a few tasks, two user turns each (calls in every turn)."""
    tasks = load_source(**{k: v for k, v in BASE.items() if k != "name"}, name=BASE["name"])[:4]
    return [ground(t.first_turns(2)) for t in tasks]


@pytest.fixture(scope="module")
def fmt() -> HermesFormat:
    return HermesFormat(tool_style="compact")


def is_gold(attempt, gold=GOLD, outcome="Done.") -> bool:
    return attempt.calls == gold and attempt.outcome == outcome


def test_the_note_is_render_memory_placed_where_test_time_places_it(trajs, tokenizer, fmt) -> None:
    traj = trajs[0]
    attempts = turn_attempts(traj, random.Random(0))
    with_note = with_notes(traj, attempts)
    assert [m.content for m in with_note.messages if m.role == "system"] == [render_memory(a) for a in attempts]
    users = [i for i, m in enumerate(with_note.messages) if m.role == "user"]
    assert all(with_note.messages[i + 1].role == "system" for i in users)  # right after each user turn
    encode, task = PieceEncoder(tokenizer), traj.task
    ids = encode_trajectory(with_note, encode, fmt).ids
    # test time: the system turn with the tools, the first user turn, Imagination's note, the assistant header
    live = Episode(task, EpisodeBuilder(encode, fmt), group=0)
    live.builder.system(task.system_prompt, task.tools)
    live.builder.user_turn(task, 0, task.user_turns[0])
    Imagination(None, ImaginationConfig(mode="parallel", n=ATTEMPTS), fmt).add_note(live, attempts[0], False)  # type: ignore[arg-type]
    live.builder.context(fmt.assistant().header)
    assert ids[: len(live.ids)] == live.ids


def test_the_note_is_context_and_never_in_the_loss(trajs, tokenizer, fmt) -> None:
    encode = PieceEncoder(tokenizer)
    for traj in trajs:
        attempts = turn_attempts(traj, random.Random(1))
        plain = encode_trajectory(traj, encode, fmt).tensors()
        ep = encode_trajectory(with_notes(traj, attempts), encode, fmt).tensors()
        notes = [encode(fmt.system(render_memory(a), [])) for a in attempts]
        assert len(ep.input_ids) == len(plain.input_ids) + sum(map(len, notes))
        at = ep.input_ids.tolist()
        for note in notes:  # each note's tokens are in the episode, tagged context, loss 0
            start = next(i for i in range(len(at)) if at[i : i + len(note)] == note)
            assert ep.roles[start : start + len(note)].eq(0).all()
            assert ep.loss_mask[start : start + len(note)].eq(0).all()
        # what the loss sees is what it saw without notes: the same act and rehearse tokens, in order
        assert torch.equal(ep.input_ids[ep.loss_mask == 1], plain.input_ids[plain.loss_mask == 1])
        assert torch.equal(ep.roles[ep.loss_mask == 1], plain.roles[plain.loss_mask == 1])


def test_fraction_zero_leaves_every_episode_token_for_token(tokenizer, fmt) -> None:
    kw = {"sources": [MISS_PARAM], "tokenizer": "tiny", "tool_style": "compact", "max_user_turns": 2}
    dms = {f: EnvACEDataModule(**kw, limit=6, memory_notes=f, seed=0) for f in (0.0, 0.5)}
    for dm in dms.values():
        dm.setup("fit")
    off, half = dms[0.0], dms[0.5]
    expected = [encode_trajectory(ground(t), PieceEncoder(tokenizer), fmt).tensors() for t in off.train_set]
    assert len(off.episodes) == len(expected) == 6 and off.counts["memory_notes"] == 0
    for ep, exp in zip(off.episodes, expected, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ep, exp, strict=True))
    pairs = list(zip(half.episodes, off.episodes, strict=True))
    same = [all(torch.equal(a, b) for a, b in zip(x, y, strict=True)) for x, y in pairs]
    assert half.counts["memory_notes"] == 3 and same.count(False) == 3  # exactly the noted ones changed
    longer = [len(x.input_ids) > len(y.input_ids) for x, y in pairs]
    assert longer == [not s for s in same]


def test_the_draw_is_seeded_and_follows_the_data_seed(trajs, monkeypatch) -> None:
    def draw(seed: int) -> list[list[str] | None]:
        return [None if t is None else [m.content for m in t.messages] for t in noted(trajs, 0.5, seed)]

    assert draw(0) == draw(0) and draw(0) != draw(1)
    assert sum(d is not None for d in draw(0)) == 2
    assert noted(trajs, 0.0, 0) == [None] * len(trajs) and None not in noted(trajs, 1.0, 0)
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    assert EnvACEDataModule([BASE]).data_seed == 7 and EnvACEDataModule([BASE], seed=3).data_seed == 3
    again = [imagined_attempts(GOLD, "Done.", TOOLS, random.Random(5)) for _ in range(2)]
    assert again[0] == again[1]


def test_a_corrupted_attempt_shows_its_error_in_the_note() -> None:
    for seed in range(20):
        attempts = imagined_attempts(GOLD, "Done.", TOOLS, random.Random(seed), both_wrong=0.0)
        assert len(attempts) == ATTEMPTS and sum(is_gold(a) for a in attempts) == 1
        (bad,) = [a for a in attempts if not is_gold(a)]
        last = bad.calls[-1]
        assert is_error(last.response) and last.response["error"]["code"] in ("INVALID_ARGUMENTS", "UNKNOWN_TOOL")
        assert bad.calls[:-1] == GOLD[: len(bad.calls) - 1] and last.call not in [g.call for g in GOLD]
        note = render_memory(attempts)
        assert f"Problems: {last.response['error']['code']} from {last.call.name}." in note
        assert last.response["error"]["message"][:60] in note
    wrong = [imagined_attempts(GOLD, "Done.", TOOLS, random.Random(s), both_wrong=1.0) for s in range(10)]
    assert all(not is_gold(a) and is_error(a.calls[-1].response) for att in wrong for a in att)


def test_both_attempts_are_wrong_in_a_declared_share() -> None:
    rng = random.Random(0)
    draws = [imagined_attempts(GOLD, "Done.", TOOLS, rng) for _ in range(400)]
    both = sum(not any(is_gold(a) for a in att) for att in draws)
    assert 60 <= both <= 140  # BOTH_WRONG = 0.25 of 400 = 100, binomial sd ~ 8.7


def test_the_gold_attempt_is_not_always_first() -> None:
    rng = random.Random(0)
    places = [[is_gold(a) for a in imagined_attempts(GOLD, "Done.", TOOLS, rng, 0.0)].index(True) for _ in range(40)]
    assert set(places) == {0, 1}


def test_a_turn_without_gold_gets_calls_that_fail(trajs) -> None:
    for tools in (TOOLS, []):
        attempts = imagined_attempts([], NO_CALL_TEXT, tools, random.Random(0))
        assert len(attempts) == ATTEMPTS
        assert all(len(a.calls) == 1 and is_error(a.calls[0].response) for a in attempts)
    gold, closing = turns(trajs[0])[0]
    assert [r.call for r in gold] == trajs[0].task.gold[0] and closing.startswith("Done")


def test_the_option_parses_and_a_bad_fraction_is_one_line() -> None:
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(EnvACEDataModule, "data")
    cfg = parser.parse_args(["--data.sources", '[{"name": "bfcl-multi-turn"}]', "--data.memory_notes", "0.5"])
    assert parser.instantiate_classes(cfg).data.memory_notes == 0.5
    assert EnvACEDataModule([BASE]).memory_notes == 0.0  # off by default
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"^memory_notes must be a fraction in \[0, 1\], got") as exc:
            EnvACEDataModule([BASE], memory_notes=bad)
        assert "\n" not in str(exc.value)
