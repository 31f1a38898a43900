"""Policies under evaluation: a Lightning checkpoint's ``policy.*`` weights load into the model it
was trained from; a save_pretrained folder loads as it is; bad checkpoints are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envace.evaluation import PolicyConfig, load_eval_policy
from envace.policy import PolicySpec, load_model


def test_checkpoint_and_folder_load_the_trained_weights(tmp_path: Path) -> None:
    trained = load_model(PolicySpec("tiny", seed=7))
    state = {f"policy.{k}": v for k, v in trained.state_dict().items()}
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": {"policy": PolicySpec("tiny", seed=7)}}, ckpt)
    policy = load_eval_policy(str(ckpt), PolicyConfig(base="smollm2-135m"))  # the checkpoint names its base
    for (name, a), b in zip(trained.state_dict().items(), policy.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not policy.model.training and not policy.reference
    trained.save_pretrained(tmp_path / "folder")
    folder = load_eval_policy(str(tmp_path / "folder"))  # no tokenizer saved: the base's tokenizer
    assert torch.equal(folder.model.lm_head.weight, trained.lm_head.weight)
    assert load_eval_policy("noop").model is None and load_eval_policy("oracle").reference


def test_bad_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_eval_policy(str(tmp_path / "missing.ckpt"))
    empty = tmp_path / "empty.ckpt"
    torch.save({"state_dict": {"model.x": torch.zeros(1)}}, empty)
    with pytest.raises(ValueError, match="no 'policy.\\*' entries"):
        load_eval_policy(str(empty), PolicyConfig(base="tiny"))
