"""RolloutLogger computes the official scores of training and of validation episodes in one place:
the same episodes give the same official figures whichever split they are logged under."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from envace.callbacks import rollout as logger_module
from envace.callbacks.rollout import RolloutLogger
from envace.data.sources import load_source
from envace.modules.outputs import RLStepOutput, ValStepOutput
from envace.protocol.render import HermesFormat
from envace.rewards.base import RewardOutput
from envace.rollout import Episode, RealEnvironment, RolloutLimits, make_rollout, summarize
from envace.rollout.reference import NoopEngine, OracleEngine

LIMITS = RolloutLimits(max_new_tokens=4096, max_calls_per_step=32, max_episode_tokens=10**6)


def _episodes(tokenizer: Any) -> list[Episode]:
    """One BFCL multi-turn task played twice: the gold calls (official pass) and silence (official fail)."""
    task = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])[0].first_turns(2)
    out = []
    for engine_cls in (OracleEngine, NoopEngine):
        engine = engine_cls(tokenizer, [tokenizer.eos_token_id])
        rollout = make_rollout(engine, tokenizer, HermesFormat(tool_style="compact"), RealEnvironment(), LIMITS,
                               validate_calls=False)  # fmt: skip
        out += rollout.run([task], 1)
    return out


def test_train_and_val_official_scores_agree_on_the_same_episodes(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    episodes = _episodes(tokenizer)
    proxy = [RewardOutput(1.0, True), RewardOutput(1.0, True)]  # the proxy pays both: the checker must not
    logged: dict[str, float] = {}
    monkeypatch.setattr(logger_module, "log_step", lambda module, scalars, always=False: logged.update(scalars))
    monkeypatch.setattr(logger_module, "log_scalars", lambda trainer, module, scalars, n=1: logged.update(scalars))
    trainer = SimpleNamespace(logger=None)
    module = SimpleNamespace(log=lambda *a, **kw: None)
    callback = RolloutLogger()
    train = RLStepOutput(loss=torch.tensor(0.0), episodes=episodes, rewards=proxy, rollout=summarize(episodes))
    callback.on_train_batch_end(trainer, module, train, None, 0)  # type: ignore[arg-type]
    val = ValStepOutput(committed=episodes, proxy=proxy, imagined=[], imagined_proxy=[], gold_episodes=[])
    callback.on_validation_batch_end(trainer, module, val, None, 0)  # type: ignore[arg-type]
    callback.on_validation_epoch_end(trainer, module)  # type: ignore[arg-type]
    assert logged["train/official/success/bfcl"] == logged["val/committed/official_success/bfcl"] == 0.5
    assert logged["train/official/proxy_only/bfcl"] == 0.5 and logged["val/committed/proxy_gap/bfcl"] == 0.5
    assert logged["train/official/scored"] == 2.0 and logged["val/committed/official_masked"] == 0.0
