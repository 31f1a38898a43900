"""``envace show``: the oracle calibrates (reward 1, fidelity 1), without a checkpoint the oracle acts
and the model rehearses, a tiny random policy acts and rehearses from a Lightning checkpoint (whose
tool style it uses), checkpoints load under the ``policy.*`` contract, the screen names who acted
and who rehearsed, and the former name ``envace rehearse`` still runs it."""

from __future__ import annotations

import re

import pytest
import torch

from envace.cli import main as envace
from envace.commands.show import load_actor, main, pick_task, show, who_acts
from envace.policy import LoraSpec, PolicySpec, load_checkpoint, load_model

TASK = "multi_turn_base_0"  # turn 0 gold: cd(document), mkdir(temp), mv(final_report.pdf -> temp)


def _fidelity_row(out: str, group: str) -> list[float]:
    line = next(x for x in out.splitlines() if x.startswith(group + " "))
    return [float(v) for v in line.split()[1:]]


def test_oracle_rehearses_perfectly_and_scores_one(capsys) -> None:
    assert show(policy="oracle", task_id=TASK) == 0
    out = capsys.readouterr().out
    assert "[context] <system turn:" in out and " tools: " in out and ", cd, cp, " in out  # tools summarised
    assert (
        "[act] <tool_call>" in out and '[rehearse] <execution_result>{"current_working_directory": "document"}' in out
    )
    table = out.split("== rehearsed vs real (3 calls) ==")[1]
    assert re.search(r"cd\(folder=\"document\"\)\s+\| \{\"current_working_directory\": \"document\"\}\s+\| "
                     r"\{\"current_working_directory\": \"document\"\}", table)  # fmt: skip
    assert _fidelity_row(out, "all") == [3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # pairs, then the six scores
    assert _fidelity_row(out, "tool/mkdir") == [1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert "reward: 1.000 (success True, bfcl-multi-turn)" in out


def test_noop_without_real_env_scores_zero(capsys) -> None:
    assert main(["--policy", "noop", "--task_id", TASK, "--real", "false", "--max_user_turns", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 user turn(s)" in out and "(no calls)" in out and "fidelity: no (rehearsed, real) pairs" in out
    assert "reward: 0.000" in out and "[rehearse]" not in out


def test_tiny_policy_from_a_lightning_checkpoint(tmp_path, capsys) -> None:
    model = load_model(PolicySpec("tiny", seed=3))
    ckpt = tmp_path / "last.ckpt"
    state = {f"policy.{k}": v for k, v in model.state_dict().items()} | {"loss_fn.weight": torch.ones(1)}
    torch.save({"state_dict": state, "epoch": 1}, ckpt)
    loaded = load_checkpoint(PolicySpec("tiny", seed=0), str(ckpt))  # another seed: weights come from the file
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    args = ["--policy", "tiny", "--checkpoint", str(ckpt), "--task_id", TASK, "--max_new_tokens", "8",
            "--rehearse_tokens", "8", "--seed", "1"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[context] <|im_start|>user" in out and re.search(r"^\[act\] ", out, re.M)
    assert (
        "== rehearsed vs real" in out and "| rehearsed" in out and re.search(r"^reward: (\d\.\d{3}|masked)", out, re.M)
    )
    assert "tokens context" in out and "act 8" in out  # a random model never stops within 8 tokens
    assert f"acted by:      tiny + {ckpt} (the act tokens)" in out and f"rehearsed by:  tiny + {ckpt}" in out
    assert "hint:" not in out


def test_without_a_checkpoint_the_oracle_acts_and_the_policy_rehearses(capsys) -> None:
    assert show(policy="tiny", task_id=TASK, rehearse_tokens=8, seed=1, progress_every=0) == 0
    out = capsys.readouterr().out
    assert "acted by:      oracle (the task's gold calls, the act tokens)" in out
    assert "rehearsed by:  tiny (its own weights write every tool response, the rehearse tokens)" in out
    assert "compared with: a real environment in lockstep" in out
    assert '[act] {"name": "cd", "arguments": {"folder": "document"}}' in out and re.search(
        r"^\[rehearse\] ", out, re.M
    )
    # the random model never closes its tool turn within 8 tokens: the first call is rehearsed, then the episode ends
    table = out.split("== rehearsed vs real (1 calls) ==")[1]
    assert 'cd(folder="document")' in table and '{"current_working_directory": "document"}' in table
    assert "rehearse 8" in out and "hint: the oracle acted" in out and "--checkpoint" in out.split("hint:")[1]


def test_who_acts() -> None:
    assert [who_acts("smollm2-135m", None, "auto"), who_acts("smollm2-135m", "x.ckpt", "auto")] == ["oracle", "policy"]
    assert who_acts("tiny", None, "policy") == "policy" and who_acts("tiny", "x.ckpt", "oracle") == "oracle"
    assert who_acts("oracle", None, "auto") == who_acts("noop", None, "policy") == "policy"
    with pytest.raises(ValueError, match="--actor 'gold': use auto, policy or oracle"):
        who_acts("tiny", None, "gold")
    with pytest.raises(ValueError, match="--policy noop is itself the actor"):
        who_acts("noop", None, "oracle")


def test_the_tool_style_comes_from_the_checkpoint(tmp_path, capsys) -> None:
    state = {f"policy.{k}": v for k, v in load_model(PolicySpec("tiny")).state_dict().items()}
    torch.save({"state_dict": state, "envace": {"tool_style": "json"}}, tmp_path / "json.ckpt")
    assert load_actor("tiny", None, None, 0).fmt.tool_style == "compact"  # the default of show
    assert load_actor("tiny", str(tmp_path / "json.ckpt"), None, 0).fmt.tool_style == "json"  # the checkpoint's
    assert capsys.readouterr().err == ""
    assert load_actor("tiny", str(tmp_path / "json.ckpt"), "compact", 0).fmt.tool_style == "compact"
    assert "tool_style 'compact' was asked for" in capsys.readouterr().err


def test_lora_checkpoint_needs_and_uses_its_hyperparameters(tmp_path) -> None:
    spec = PolicySpec("tiny", seed=0, lora=LoraSpec(r=4, target_modules=["q_proj"]))
    model = load_model(spec)
    trainable = {f"policy.{n}": torch.randn_like(p) for n, p in model.named_parameters() if p.requires_grad}
    torch.save({"state_dict": trainable, "hyper_parameters": {"policy": spec}}, tmp_path / "lora.ckpt")
    loaded = dict(load_checkpoint(PolicySpec("tiny"), str(tmp_path / "lora.ckpt")).named_parameters())
    assert len(trainable) == 4 and all(torch.equal(loaded[k.removeprefix("policy.")], v) for k, v in trainable.items())
    torch.save({"state_dict": trainable}, tmp_path / "bare.ckpt")
    with pytest.raises(ValueError, match="no saved policy spec"):
        load_checkpoint(PolicySpec("tiny"), str(tmp_path / "bare.ckpt"))
    torch.save({"state_dict": {"model.w": torch.ones(1)}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="no 'policy.\\*' entries"):
        load_checkpoint(PolicySpec("tiny"), str(tmp_path / "other.ckpt"))


def test_pick_task_defaults_and_errors() -> None:
    first = pick_task("bfcl-multi-turn", "all", None, None, None)
    assert first.id == TASK and len(first.user_turns) == len(first.gold) == 4
    cut = pick_task("bfcl-multi-turn", "all", None, TASK, 2)
    assert len(cut.user_turns) == len(cut.gold) == 2 and cut.user_turns == first.user_turns[:2]
    with pytest.raises(ValueError, match="no task 'nope'"):
        pick_task("bfcl-multi-turn", "all", None, "nope", 1)


def test_the_former_name_still_runs_with_a_note(capsys) -> None:
    assert envace(["rehearse", "--policy", "noop", "--task_id", TASK, "--real", "false"]) == 0
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if "renamed" in line] == [
        "envace rehearse: renamed to `envace show`; running that"
    ]
    assert "(no calls)" in out and "reward: 0.000" in out


def test_a_reference_policy_takes_no_checkpoint() -> None:
    with pytest.raises(ValueError, match="has no weights"):
        show(policy="oracle", checkpoint="last.ckpt")
