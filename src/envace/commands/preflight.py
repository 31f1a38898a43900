"""Checks of a parsed command before anything is built: a missing file, an unknown model name or a
logger whose package is not installed is a one-line :class:`~envace.commands.errors.UsageError`
in well under a second, instead of a traceback after the model is built (or after a minute of
download retries), and no run folder is left behind.

* :func:`check_fit_config` — ``envace fit | validate``: ``ckpt_path``, the data sources and their
  rewards (registered, or a ``package.module:function`` that imports), the policy's ``name_or_path``
  and ``checkpoint``, the simulator's source, and the loggers' packages (``envace[wandb]``, ...);
* :func:`check_sources` — the user's own sources (``tasks``, ``package.module:function``) loaded once:
  their rows, their Python environments' imports and tool schemas, and each user reward called once
  on a probe episode (:func:`envace.rewards.userfn.probe_reward`); each failure one line;
* :func:`check_model_source` — a packaged name, ``tiny``, a folder, a model in the Hugging Face cache,
  or a hub id the hub knows (asked once, bounded by :data:`HUB_TIMEOUT_S`; never with
  ``HF_HUB_OFFLINE``). ``envace evaluate`` uses the last two (:mod:`envace.commands.evaluate`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from envace.commands.errors import UsageError, did_you_mean
from envace.policy import PACKAGED, TINY

#: seconds the one question to the hub may take (name resolution included)
HUB_TIMEOUT_S = 3.0
#: ``ckpt_path`` values Lightning resolves itself
LIGHTNING_CKPT = ("last", "best", "hpc", "registry")
#: loggers whose package is optional: the package and how to install it
LOGGER_EXTRAS = {
    "WandbLogger": ("wandb", "pip install 'envace[wandb]'"),
    "MLFlowLogger": ("mlflow", "pip install 'envace[mlflow]'"),
    "CometLogger": ("comet_ml", "pip install comet-ml"),
    "NeptuneLogger": ("neptune", "pip install neptune"),
}


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def offline() -> bool:
    """Whether the Hugging Face libraries are told not to use the network."""
    return _truthy("HF_HUB_OFFLINE") or _truthy("TRANSFORMERS_OFFLINE")


def cached_hub_models() -> list[str]:
    """The hub ids with a downloaded snapshot (its ``config.json``) in the Hugging Face cache (``HF_HUB_CACHE``)."""
    from huggingface_hub import constants

    root = Path(os.environ.get("HF_HUB_CACHE", constants.HF_HUB_CACHE))
    found = {p.parents[2].name for p in root.glob("models--*/snapshots/*/config.json")} if root.is_dir() else set()
    return sorted(name.removeprefix("models--").replace("--", "/") for name in found)


def ask_hub(name: str) -> str:
    """``found``, ``unknown`` or ``unreachable``: what the hub (``HF_ENDPOINT``) says of the model
    ``name``, asked once in a thread given :data:`HUB_TIMEOUT_S` (a name lookup that hangs included)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/models/{name}")
    if os.environ.get("HF_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['HF_TOKEN']}")
    answer = ["unreachable"]

    def ask() -> None:
        try:
            with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S):
                answer[0] = "found"
        except urllib.error.HTTPError as exc:  # the hub answers 401 for an id it does not know
            answer[0] = "unknown" if exc.code in (401, 404) else "found"  # other answers: let transformers try
        except (OSError, ValueError):
            answer[0] = "unreachable"

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S + 1)
    return answer[0]


def check_model_source(name: str, key: str, references: tuple[str, ...] = ()) -> None:
    """Raise :class:`UsageError` unless the model ``name`` (the value of ``key``) can be loaded: one of
    ``references`` (reference policies), a ``.ckpt`` file, a packaged name, ``tiny``, a folder, a hub
    id in the local cache, or (online) a hub id the hub knows."""
    local = [*references, *PACKAGED, TINY, *cached_hub_models()]
    if name in local or Path(name).expanduser().is_dir():
        return
    if name.endswith(".ckpt"):
        if not Path(name).is_file():
            raise UsageError(f"{key} {name}: no such checkpoint file")
        return
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise UsageError(f"{key} {name}: no such folder (local names: {', '.join(local)})")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise UsageError(f"{key} {name!r} is not a packaged name, a folder or a hub id{did_you_mean(name, local)} "
                         f"(local names: {', '.join(local)})") from None  # fmt: skip
    answer = "offline" if offline() else ask_hub(name)
    if answer == "found":
        return
    why = {
        "offline": "HF_HUB_OFFLINE is set",
        "unreachable": f"the hub ({os.environ.get('HF_ENDPOINT', 'huggingface.co')}) cannot be reached: offline?",
        "unknown": "the hub has no model of that id (a private one needs HF_TOKEN)",
    }[answer]
    raise UsageError(f"{key} {name!r} is not a packaged name, a folder or a model in the Hugging Face cache, "
                     f"and {why}{did_you_mean(name, local)} (local names: {', '.join(local)})")  # fmt: skip


def value(config: Any, key: str) -> Any:
    """``config[key]`` for a dotted ``key`` through namespaces, dicts and dataclasses (``None`` when absent)."""
    for part in key.split("."):
        if config is None:
            return None
        config = config.get(part) if isinstance(config, dict) or hasattr(config, "get") else getattr(config, part, None)
    return config


def check_ckpt_path(path: str | None) -> None:
    """A ``ckpt_path`` that is a local path must exist: a ``.ckpt`` file, or the folder a distributed
    (FSDP) checkpoint is saved as (Lightning's own names and URLs pass)."""
    if path is None or path in LIGHTNING_CKPT or path.startswith("registry:") or "://" in path:
        return
    if not Path(path).exists():
        raise UsageError(f"--ckpt_path {path}: no such file; give a Lightning .ckpt, or 'last' to resume the run")


def check_loggers(loggers: Any) -> None:
    """Every configured logger whose package is optional must have it installed."""
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        name = str(value(logger, "class_path") or "").rsplit(".", 1)[-1]
        if name in LOGGER_EXTRAS and importlib.util.find_spec(LOGGER_EXTRAS[name][0]) is None:
            package, install = LOGGER_EXTRAS[name]
            raise UsageError(f"trainer.logger {name} needs the {package!r} package: {install}")


def check_plugins(config: Any) -> None:
    """Every data source a config names, and every ``reward`` option of one, must be registered or a
    ``package.module:function`` that imports (the user's own): else one line naming it."""
    from envace.data.sources import SOURCES
    from envace.rewards import REWARDS
    from envace.rewards.userfn import named_callable

    for key in ("sources", "val_sources"):
        for i, spec in enumerate(value(config, f"data.{key}") or []):
            where = f"data.{key}[{i}]"
            checks = [("name", value(spec, "name"), SOURCES, "data source")]
            reward = value(spec, "reward") or value(spec, "options.reward")
            if reward is not None:
                checks.append(("reward", reward, REWARDS, "reward"))
            for field, name, table, what in checks:
                if not isinstance(name, str) or name in table:
                    continue
                if ":" not in name:
                    known = ", ".join(sorted(table))
                    raise UsageError(f"{where}.{field}: unknown {what} {name!r}{did_you_mean(name, list(table))} "
                                     f"(registered: {known}; or your own as package.module:function)")  # fmt: skip
                try:
                    named_callable(name, what)
                except ValueError as exc:
                    raise UsageError(f"{where}.{field}: {exc}") from None


def _plain(spec: Any) -> dict[str, Any]:
    return spec.as_dict() if hasattr(spec, "as_dict") else dict(spec)


def check_sources(config: Any) -> None:
    """Load every user source of ``config`` once (``tasks``, or ``package.module:function``) and check
    what it gave before anything is built: a list of tasks, their Python environments importable with
    usable tool schemas, and each user reward right on a probe episode (see the module docstring)."""
    from envace.data.sources import SourceSpec
    from envace.envs.mcp_bridge import one_line
    from envace.envs.pytools import python_tools
    from envace.rewards.userfn import probe_reward
    from envace.types import Task

    for key in ("sources", "val_sources"):
        for i, raw in enumerate(value(config, f"data.{key}") or []):
            spec, where = SourceSpec.parse(_plain(raw)), f"data.{key}[{i}]"
            if spec.name != "tasks" and ":" not in spec.name:
                continue  # a benchmark of ours: its loader is tested
            try:
                tasks = spec.load()
            except ValueError as exc:  # a row, an import, a server: already one line
                raise UsageError(f"{where}: {str(exc).strip().splitlines()[0][:600]}") from None
            except Exception as exc:  # the user's own source: one line, whatever it raised
                raise UsageError(f"{where}: {one_line(exc)}") from None
            if not isinstance(tasks, list) or not all(isinstance(t, Task) for t in tasks):
                got = type(tasks).__name__ if not isinstance(tasks, list) else "a list holding non-Task items"
                raise UsageError(f"{where}: source {spec.name!r} returned {got}; a source returns a list of Task")
            envs = {json.dumps(t.env, sort_keys=True): t.env for t in tasks if t.env and t.env.get("kind") == "python"}
            rewards = {
                str(t.extra["reward"]): t for t in reversed(tasks) if ":" in str(t.extra.get("reward", ""))
            }  # each on its first task
            try:
                for env in envs.values():
                    python_tools(env)
                for name, task in rewards.items():
                    probe_reward(name, task)
            except ValueError as exc:
                raise UsageError(f"{where}: {exc}") from None


def check_fit_config(config: Any) -> None:
    """The checks of an ``envace fit | validate`` config (one subcommand's namespace)."""
    check_ckpt_path(value(config, "ckpt_path"))
    check_plugins(config)
    check_sources(config)
    check_loggers(value(config, "trainer.logger"))
    args = value(config, "model.init_args")
    policy = value(args, "policy")
    if policy is not None:
        check_model_source(str(value(policy, "name_or_path") or "smollm2-135m"), "model.policy.name_or_path")
        checkpoint = value(policy, "checkpoint")
        if checkpoint is not None and not Path(checkpoint).is_file():
            raise UsageError(f"model.policy.checkpoint {checkpoint}: no such checkpoint file")
    source = value(args, "simulator.source")
    if source is not None and source not in ("warm_start", "policy"):
        check_model_source(str(source), "model.simulator.source")
    check_vllm(value(args, "sampling"))


def check_vllm(sampling: Any) -> None:
    """``sampling.engine: vllm`` that launches its server needs the vLLM venv (``make vllm``)."""
    if value(sampling, "engine") != "vllm" or value(sampling, "vllm.url") is not None:
        return
    from envace.rollout.engine.vllm.http import VLLMError
    from envace.rollout.engine.vllm.server import vllm_python

    try:
        vllm_python(str(value(sampling, "vllm.venv") or ".venv-vllm"))
    except VLLMError as exc:
        raise UsageError(str(exc)) from None
