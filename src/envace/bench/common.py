"""What the benchmark sections share: timing summaries, the policy under test, BFCL tasks."""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from envace.types import Task


@dataclass(frozen=True)
class Sizes:
    """How much each section measures (``--quick`` shrinks everything for the test).

    Args:
        model: policy name (``smollm2-135m``; ``tiny`` for the quick test).
        train_tokens: sequence lengths of the training measurement.
        train_reps: timed updates per (length, precision); the fastest is reported.
        peak_sizes: square matmul sizes of the peak measurement.
        group_size: episodes generated together in the batched rollout (and one at a time).
        act_tokens: most tokens of one act generation.
        rehearse_tokens: most tokens of one rehearsed tool response.
        user_turns: user turns of each rollout episode.
        layout_tasks: grounded BFCL multi-turn episodes counted by the layout section.
        trl_runs: timed optimisation steps on each side of the TRL comparison.
        trl_group: completions per prompt in the TRL comparison.
        trl_tokens: most tokens per completion in the TRL comparison.
    """

    model: str = "smollm2-135m"
    train_tokens: tuple[int, ...] = (512, 2048)
    train_reps: int = 2
    peak_sizes: tuple[int, ...] = (512, 1024, 2048)
    group_size: int = 8
    act_tokens: int = 48
    rehearse_tokens: int = 48
    user_turns: int = 2
    layout_tasks: int = 40
    trl_runs: int = 5
    trl_group: int = 8
    trl_tokens: int = 64


QUICK = Sizes(
    model="tiny",
    train_tokens=(64, 128),
    train_reps=1,
    peak_sizes=(128,),
    group_size=2,
    act_tokens=4,
    rehearse_tokens=4,
    user_turns=1,
    layout_tasks=2,
    trl_runs=2,
    trl_group=2,
    trl_tokens=4,
)


def summary(seconds: list[float]) -> dict[str, Any]:
    """``min``/``median``/``max`` of a list of durations, and the list itself."""
    return {
        "min": min(seconds),
        "median": statistics.median(seconds),
        "max": max(seconds),
        "runs": [round(s, 4) for s in seconds],
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, result)`` of one call."""
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


@contextmanager
def quiet() -> Iterator[None]:
    """Silence the warnings libraries print on every step (logging without a trainer, deprecations)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def param_count(model: Any) -> int:
    """All parameters, the tied embedding counted once (as ``6 · params · tokens`` counts them)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def bfcl_tasks(user_turns: int | None = None) -> list[Task]:
    """BFCL-v4 ``multi_turn_base`` tasks (all splits), cut to their first ``user_turns`` turns."""
    from envace.data.sources import load_source

    tasks = load_source("bfcl-multi-turn", split="all", categories=["multi_turn_base"])
    return [t.first_turns(user_turns) for t in tasks]


def make_module(model: str, group_size: int = 4, **kwargs: Any) -> Any:
    """An :class:`~envace.modules.EnvACEModule` on ``model`` (full fine-tuning, fp32 weights, compact
    tools), its policy built as ``configure_model`` builds it."""
    from envace.modules import EnvACEModule
    from envace.policy import PolicySpec

    module = EnvACEModule(policy=PolicySpec(model), tool_style="compact", group_size=group_size, **kwargs)
    module.configure_model()
    return module


def trained_policy(model: str, checkpoint: str) -> Any:
    """The policy of a Lightning checkpoint of ``model`` (loaded as ``envace evaluate`` loads it:
    :func:`envace.evaluation.policies.load_eval_policy`), LoRA adapters merged into the weights and
    every weight trainable, so that it is measured exactly as the packaged model is (fp32, full
    fine-tuning)."""
    from envace.evaluation.policies import PolicyConfig, load_eval_policy

    policy = load_eval_policy(checkpoint, PolicyConfig(base=model)).model
    merged = policy.merge_and_unload() if hasattr(policy, "merge_and_unload") else policy
    return merged.requires_grad_(True)


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
