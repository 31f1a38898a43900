"""The policy for inference: a checkpoint, the packaged model, or a reference policy.

The one loader (:func:`load_eval_policy`) and the one registry of reference policies
(:data:`REFERENCE_POLICIES`) behind ``envace evaluate --policy``, ``envace show --policy/--checkpoint``
and ``envace bench --checkpoint``. A name is

* ``oracle`` — writes the benchmark's gold (its own reference calls per benchmark; no model);
* ``noop`` — never calls a tool (no model);
* ``smollm2-135m`` (packaged), ``tiny`` (random, tests), a hub id or a ``save_pretrained`` folder;
* a Lightning ``.ckpt`` of the training module: its ``state_dict`` entries ``policy.*`` are loaded
  into the model it was trained from (``hyper_parameters["policy"].name_or_path`` when saved, else
  :attr:`PolicyConfig.base`), with LoRA adapters rebuilt from ``hyper_parameters["policy"].lora`` when
  the checkpoint holds adapter weights only; the tool style and chat format it was trained with
  are the defaults of :class:`PolicyConfig` (:mod:`envace.evaluation.provenance`). It is read with
  ``torch.load(weights_only=True)``.
  That is the contract with the training LightningModule, which holds the Hugging Face model as
  attribute ``policy``.

Reference policies write the benchmark's own data, so their calls run as the official harnesses run
gold: without the argument-schema check (dispatch stays whitelisted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.evaluation.provenance import CheckpointInfo, checkpoint_info, settle
from envace.policy import PolicySpec, checkpoint_spec, load_checkpoint, load_model, load_tokenizer, read_checkpoint
from envace.protocol.render import ChatFormat, make_format
from envace.rollout import Engine, Episode, SamplingConfig, make_engine, stop_ids
from envace.rollout.reference import NoopEngine, OracleEngine, ScriptedEngine

#: the reference policies (no model) and the engine each writes with; the oracle writes the
#: benchmark's own oracle text where a benchmark gives one (:meth:`Policy.engine`), else the gold
REFERENCE_POLICIES: dict[str, type[ScriptedEngine]] = {"oracle": OracleEngine, "noop": NoopEngine}


@dataclass
class PolicyConfig:
    """Which policy to evaluate and how it is loaded.

    Args:
        dtype: weight dtype of a model policy (``float32`` or ``bfloat16``).
        base: the model a ``.ckpt`` checkpoint's weights are loaded into, when the checkpoint does not
            name it (``hyper_parameters["policy"]``), and the tokenizer of a folder saved without one.
        chat_format: ``auto`` (the tokenizer's template when it renders tools, else Hermes),
            ``template`` or ``hermes``; default: what a ``.ckpt`` checkpoint was trained with, else
            ``auto``. A value the checkpoint contradicts is used, with a one-line warning.
        tool_style: how the Hermes format lists tools: ``json`` (full schemas) or ``compact``;
            default: what a ``.ckpt`` checkpoint was trained with, else ``json``.
        seed: weight seed of the ``tiny`` test model.
    """

    dtype: str = "float32"
    base: str = "smollm2-135m"
    chat_format: str | None = None
    tool_style: str | None = None
    seed: int = 0


@dataclass
class TextEngine(ScriptedEngine):
    """A scripted engine whose text per episode comes from a function (the benchmark's oracle)."""

    text: Callable[[Episode], str] = field(default=lambda ep: "")

    def text_for(self, episode: Episode) -> str:
        return self.text(episode)


@dataclass
class Policy:
    """A loaded policy: its tokenizer and chat format, and its model (``None`` for reference policies);
    ``chat_format`` the format asked for (``fmt`` is what it resolved to), ``checkpoint`` the
    ``.ckpt`` it was loaded from."""

    name: str
    tokenizer: Any
    fmt: ChatFormat
    model: Any = None
    chat_format: str = "auto"
    checkpoint: CheckpointInfo | None = None

    @property
    def reference(self) -> bool:
        return self.name in REFERENCE_POLICIES

    def engine(self, sampling: SamplingConfig, oracle: Callable[[Episode], str] | None = None) -> Engine:
        """A fresh generation engine: sampling over the model, or the scripted reference policy
        (``oracle``: what the oracle writes at each act step; default: each turn's gold calls)."""
        if not self.reference:
            return make_engine(self.model, self.tokenizer, self.fmt, sampling)
        stops = stop_ids(self.tokenizer, self.fmt)
        if self.name == "oracle" and oracle is not None:
            return TextEngine(self.tokenizer, stops, text=oracle)
        return REFERENCE_POLICIES[self.name](self.tokenizer, stops)


def load_eval_policy(name: str, config: PolicyConfig | None = None, tool_style: str = "json") -> Policy:
    """Load ``name`` (see the module docstring) for inference; models are put in eval mode.

    ``tool_style``: the tool rendering when neither ``config`` nor a checkpoint names one.
    """
    config = config or PolicyConfig()
    tok_source = "tiny" if name in REFERENCE_POLICIES else name
    model: Any = None
    info = None
    if name.endswith(".ckpt"):
        ckpt = read_checkpoint(name)
        trained = checkpoint_spec(ckpt)  # the base the weights belong to, when the module saved it
        tok_source = trained.name_or_path if trained is not None else config.base
        info = checkpoint_info(name, ckpt, base=tok_source)
        model = load_checkpoint(PolicySpec(tok_source, dtype=config.dtype, seed=config.seed), name, ckpt)
    elif name not in REFERENCE_POLICIES:
        if Path(name).is_dir() and not (Path(name) / "tokenizer_config.json").exists():
            tok_source = config.base  # weights saved without their tokenizer
        model = load_model(PolicySpec(name, dtype=config.dtype, seed=config.seed))
    tokenizer = load_tokenizer(tok_source)
    chat_format = settle("chat_format", config.chat_format, info, "auto")
    style = settle("tool_style", config.tool_style, info, tool_style)
    fmt = make_format(tokenizer, chat_format, style)  # type: ignore[arg-type]
    return Policy(name, tokenizer, fmt, model.eval() if model is not None else None, chat_format, info)
