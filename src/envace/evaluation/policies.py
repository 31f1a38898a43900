"""The policy under evaluation: a checkpoint, the packaged model, or a reference policy.

``--policy`` takes

* ``oracle`` — writes the benchmark's gold (its own reference calls per benchmark; no model);
* ``noop`` — never calls a tool (no model);
* ``smollm2-135m`` (packaged), ``tiny`` (random, tests), a hub id or a ``save_pretrained`` folder;
* a Lightning ``.ckpt`` of the training module: its ``state_dict`` entries ``policy.*`` are loaded
  into the model it was trained from (``hyper_parameters["policy"].name_or_path`` when saved, else
  ``--model.base``), with LoRA adapters rebuilt from ``hyper_parameters["policy"].lora`` when the
  checkpoint holds adapter weights only. It is read with ``torch.load(weights_only=True)``.

Reference policies write the benchmark's own data, so their calls run as the official harnesses run
gold: without the argument-schema check (dispatch stays whitelisted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.policy import PolicySpec, checkpoint_spec, load_checkpoint, load_model, load_tokenizer, read_checkpoint
from envace.protocol.render import ChatFormat, make_format
from envace.rollout import Engine, SamplingConfig, make_engine, stop_ids
from envace.rollout.loop import Episode
from envace.rollout.reference import NoopEngine, ScriptedEngine

REFERENCE_POLICIES = ("oracle", "noop")


@dataclass
class PolicyConfig:
    """Which policy to evaluate and how it is loaded.

    Args:
        dtype: weight dtype of a model policy (``float32`` or ``bfloat16``).
        base: the model a ``.ckpt`` checkpoint's weights are loaded into, when the checkpoint does not
            name it (``hyper_parameters["policy"]``).
        chat_format: ``auto`` (the tokenizer's template when it renders tools, else Hermes),
            ``template`` or ``hermes``; use what the checkpoint was trained with.
        tool_style: how the Hermes format lists tools: ``json`` (full schemas) or ``compact``.
        seed: weight seed of the ``tiny`` test model.
    """

    dtype: str = "float32"
    base: str = "smollm2-135m"
    chat_format: str = "auto"
    tool_style: str = "json"
    seed: int = 0


@dataclass
class TextEngine(ScriptedEngine):
    """A scripted engine whose text per episode comes from a function (the benchmark's oracle)."""

    text: Callable[[Episode], str] = field(default=lambda ep: "")

    def text_for(self, episode: Episode) -> str:
        return self.text(episode)


@dataclass
class Policy:
    """A loaded policy: its tokenizer and chat format, and its model (``None`` for reference policies)."""

    name: str
    tokenizer: Any
    fmt: ChatFormat
    model: Any = None

    @property
    def reference(self) -> bool:
        return self.name in REFERENCE_POLICIES

    def engine(self, sampling: SamplingConfig, oracle: Callable[[Episode], str] | None = None) -> Engine:
        """A fresh generation engine: sampling over the model, or the scripted reference policy."""
        stops = stop_ids(self.tokenizer, self.fmt)
        if self.name == "noop":
            return NoopEngine(self.tokenizer, stops)
        if self.name == "oracle":
            if oracle is None:
                raise ValueError("this benchmark defines no oracle")
            return TextEngine(self.tokenizer, stops, text=oracle)
        return make_engine(self.model, self.tokenizer, self.fmt, sampling)


def load_eval_policy(name: str, config: PolicyConfig | None = None) -> Policy:
    """Load ``name`` (see the module docstring) for evaluation; models are put in eval mode."""
    config = config or PolicyConfig()
    tok_source = "tiny" if name in REFERENCE_POLICIES else name
    model: Any = None
    if name.endswith(".ckpt"):
        ckpt = read_checkpoint(name)
        trained = checkpoint_spec(ckpt)  # the base the weights belong to, when the module saved it
        tok_source = trained.name_or_path if trained is not None else config.base
        model = load_checkpoint(PolicySpec(tok_source, dtype=config.dtype, seed=config.seed), name, ckpt)
    elif name not in REFERENCE_POLICIES:
        if Path(name).is_dir() and not (Path(name) / "tokenizer_config.json").exists():
            tok_source = config.base  # weights saved without their tokenizer
        model = load_model(PolicySpec(name, dtype=config.dtype, seed=config.seed))
    tokenizer = load_tokenizer(tok_source)
    fmt = make_format(tokenizer, config.chat_format, config.tool_style)  # type: ignore[arg-type]
    return Policy(name, tokenizer, fmt, model.eval() if model is not None else None)
