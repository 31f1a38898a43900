"""A checkpoint's rendering is read from it (an option that contradicts it warns, naming both), its
step goes into ``summary.json``, and the version and commit records are bounded and honest."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from envace.evaluation import PolicyConfig, TaskFilter, evaluate, load_eval_policy
from envace.evaluation.provenance import CheckpointInfo, checkpoint_info, git_commit, settle, versions
from envace.policy import PolicySpec, load_model
from envace.rollout import RolloutLimits


def _checkpoint(path: Path, **saved: str) -> Path:
    """A tiny model's Lightning checkpoint at step 7 that records ``saved`` as the training module does
    (tool style in ``envace``, chat format in the data module's hyper-parameters)."""
    state = {f"policy.{k}": v for k, v in load_model(PolicySpec("tiny", seed=2)).state_dict().items()}
    envace = {"tool_style": saved["tool_style"]} if "tool_style" in saved else {}
    data = {"chat_format": saved["chat_format"]} if "chat_format" in saved else {}
    torch.save({"state_dict": state, "global_step": 7, "epoch": 1, "envace": envace,
                "datamodule_hyper_parameters": data}, path)  # fmt: skip
    return path


def test_the_checkpoint_decides_the_rendering_unless_asked(tmp_path: Path, capsys) -> None:
    ckpt = str(_checkpoint(tmp_path / "last.ckpt", tool_style="compact", chat_format="hermes"))
    pol = load_eval_policy(ckpt, PolicyConfig(base="tiny"))
    assert type(pol.fmt).__name__ == "HermesFormat" and pol.fmt.tool_style == "compact" and pol.chat_format == "hermes"
    assert pol.checkpoint == CheckpointInfo(str(Path(ckpt).resolve()), 7, 1, "tiny", "compact", "hermes")
    assert capsys.readouterr().err == ""
    asked = load_eval_policy(ckpt, PolicyConfig(base="tiny", tool_style="json", chat_format="hermes"))
    assert asked.fmt.tool_style == "json"  # what was asked for is used ...
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "tool_style 'json' was asked for" in warned[0] and "tool_style 'compact'" in warned[0]
    bare = load_eval_policy(str(_checkpoint(tmp_path / "old.ckpt")), PolicyConfig(base="tiny"))
    assert bare.fmt.tool_style == "json" and bare.checkpoint is not None and bare.checkpoint.tool_style is None


def test_settle_and_checkpoint_info_of_odd_files() -> None:
    info = checkpoint_info("x.ckpt", {"global_step": "7", "envace": [], "hyper_parameters": {"tool_style": "compact"}})
    assert (info.global_step, info.tool_style, info.chat_format) == (None, "compact", None)
    odd = {"envace": {"tool_style": "yaml"}, "datamodule_hyper_parameters": {"tool_style": "json", "chat_format": 3}}
    assert (checkpoint_info("y.ckpt", odd).tool_style, checkpoint_info("y.ckpt", odd).chat_format) == ("json", None)
    assert settle("tool_style", None, info, "json") == "compact"
    assert (
        settle("chat_format", None, info, "auto") == "auto"
        and settle("chat_format", "template", None, "x") == "template"
    )


def test_summary_names_the_checkpoint_and_its_step(tmp_path: Path) -> None:
    ckpt = str(_checkpoint(tmp_path / "last.ckpt", tool_style="compact"))
    evaluate("bfcl", ckpt, tasks=TaskFilter(task_ids=["multi_turn_base_105"], categories=["multi_turn_base"],
             max_user_turns=1), limits=RolloutLimits(max_new_tokens=4, max_steps_per_turn=1, max_rehearse_tokens=4),
             model=PolicyConfig(base="tiny"), out=str(tmp_path / "out"), quiet=True)  # fmt: skip
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["policy"]["checkpoint"]["global_step"] == 7 and summary["policy"]["tool_style"] == "compact"
    assert summary["policy"]["checkpoint"]["path"] == str(Path(ckpt).resolve())
    assert summary["arguments"]["model"]["tool_style"] is None  # not asked: the checkpoint's


def test_versions_and_git(tmp_path: Path) -> None:
    found = versions()
    assert found["torch"] == torch.__version__ and found["python"].count(".") == 2
    assert git_commit(tmp_path) is None  # not a git tree
    here = git_commit()
    assert here is None or (len(here["commit"]) == 40 and isinstance(here["dirty"], bool))
    repo = tmp_path / "repo"
    (repo / "docs" / "experiments").mkdir(parents=True)
    (repo / "studies" / "s").mkdir(parents=True)
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    (repo / "docs" / "experiments" / "experiment.json").write_text("{}\n")
    (repo / "studies" / "s" / "experiment.json").write_text("{}\n")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    (repo / "docs" / "experiments" / "experiment.json").write_text('{"arms": []}\n')  # a grid writes its weights
    (repo / "studies" / "s" / "experiment.json").write_text('{"arms": []}\n')  # and its results
    assert git_commit(repo / "docs")["dirty"] is False
    (repo / "code.py").write_text("x = 2\n")  # the code changed
    assert git_commit(repo / "docs")["dirty"] is True
