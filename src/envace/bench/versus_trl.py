"""Our optimisation step against TRL's ``GRPOTrainer``: same model, prompts, group size, completion
length, precision (fp32) and optimizer, on single-turn BFCL.

One step is: sample the group's completions, score them, one forward and backward pass, one AdamW
step. Ours is ``EnvACEModule.rl_step`` (shared-prefix KV cache in sampling, the prompt run once
per group in the loss forward); each episode is one act generation (a call is answered from a
replay log, no rehearsal) so both sides generate the same thing. TRL runs with its gradient
checkpointing off and in fp32, like ours. Steps are timed with a callback; the first step of each
side is a warm-up and not counted; half of our timed steps run before TRL's and half after, so
that a drift in the machine's load affects both sides.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

from envace.bench.common import make_module, quiet, summary
from envace.data.batch import StepBatch
from envace.protocol import parse_act
from envace.protocol.tokens import EpisodeBuilder, PieceEncoder
from envace.rollout import Replay, RolloutLimits
from envace.types import Task


def single_turn_tasks(count: int) -> list[Task]:
    """The first ``count`` BFCL ``simple_python`` tasks."""
    from envace.data.sources import load_source

    return load_source("bfcl-single-turn", split="all", categories=["simple_python"])[:count]


def prompt_text(module: Any, task: Task) -> str:
    """The exact prompt our rollout feeds (system turn with compact tools, user turn, assistant header)."""
    ep = EpisodeBuilder(PieceEncoder(module.tokenizer), module.fmt)
    ep.system(task.system_prompt, task.tools)
    ep.user(task.user_turns[0])
    ep.context(module.fmt.assistant().header)
    return str(module.tokenizer.decode(ep.ids, skip_special_tokens=False))


class _Ours:
    """Our side: an EnvACE module and its AdamW, stepping one task per optimisation step."""

    def __init__(self, model: str, group: int, max_new: int, lr: float):
        limits = RolloutLimits(max_steps_per_turn=1, max_new_tokens=max_new, max_episode_tokens=4096)
        self.module = make_module(model, group_size=group, responder=Replay(), limits=limits)
        params = [p for p in self.module.policy.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=lr)
        self.completion_tokens: list[float] = []

    def step(self, task: Task) -> float:
        began = time.perf_counter()
        with quiet():
            out = self.module.rl_step(StepBatch(tasks=[task]))
            out["loss"].backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.completion_tokens.append(out["rollout"].act_tokens / len(out["episodes"]))
        return time.perf_counter() - began


def _format_reward(completions: list[str], **_: Any) -> list[float | None]:
    """1 for a completion holding a well-formed tool call (cheap, like our reward)."""
    return [float(bool(parse_act(c, None).calls)) for c in completions]


def trl_steps(model: str, tokenizer: Any, prompts: list[str], group: int, max_new: int, lr: float) -> dict[str, Any]:
    """Run TRL's GRPOTrainer for ``len(prompts)`` steps (one prompt each); seconds of every step."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envace.policy import PolicySpec, load_model

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.lengths: list[float] = []
            self._began = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._began = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.seconds.append(time.perf_counter() - self._began)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out, quiet():
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=group,
            num_generations=group,
            max_completion_length=max_new,
            learning_rate=lr,
            beta=0.0,
            max_steps=len(prompts),
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            shuffle_dataset=False,
            temperature=1.0,
            top_p=1.0,
            disable_tqdm=True,
            seed=0,
        )
        trainer = GRPOTrainer(
            model=_trainable(load_model(PolicySpec(model))),
            reward_funcs=_format_reward,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tokenizer,
            callbacks=[timer],
        )
        trainer.train()
    return {"seconds": timer.seconds, "completion_tokens": timer.lengths}


def _trainable(model: Any) -> Any:
    """The packaged model's config still names its GGUF source, so transformers attaches a GGUF
    quantizer to every load and HF's Trainer refuses to fine-tune it; the weights are plain fp32."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def bench_trl(model: str, runs: int, group: int, max_new: int, lr: float = 1e-6) -> dict[str, Any]:
    """Seconds per optimisation step on each side (``runs`` timed steps after one warm-up), and ours ÷ TRL."""
    try:
        import trl
    except ImportError:
        return {"skipped": "trl is not installed (pip install trl)"}
    tasks = single_turn_tasks(runs + 1)
    ours = _Ours(model, group, max_new, lr)
    first = runs // 2 + 1
    ours_seconds = [ours.step(t) for t in tasks[:first]]  # warm-up, then the first half
    theirs = trl_steps(model, ours.module.tokenizer, [prompt_text(ours.module, t) for t in tasks], group, max_new, lr)
    ours_seconds += [ours.step(t) for t in tasks[first:]]
    mine, other = summary(ours_seconds[1:]), summary(theirs["seconds"][1:])
    return {
        "trl_version": trl.__version__,
        "category": "simple_python",
        "group_size": group,
        "max_completion_tokens": max_new,
        "ours": {**mine, "completion_tokens_mean": _mean(ours.completion_tokens[1:])},
        "trl": {**other, "completion_tokens_mean": _mean(theirs["completion_tokens"][1:])},
        "ratio": {k: round(mine[k] / other[k], 3) for k in ("min", "median", "max")},
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None
