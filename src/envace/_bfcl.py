"""Import bfcl-eval's checkers offline (docs/design.md §4).

bfcl-eval is installed ``--no-deps``. Its ``constants.model_config`` imports every vendor client
(openai, anthropic, ...), which we neither have nor need, so a small stand-in module replaces it in
``sys.modules`` before ``ast_checker`` is imported. ``BFCL_PROJECT_ROOT`` points at a writable
cache folder instead of site-packages.

The memory backends (``memory_kv``, ``memory_rec_sum``) also import ``overrides`` and ``rank_bm25``,
two of bfcl-eval's declared dependencies; they are in this project's dependencies.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace.paths import cache_dir

if TYPE_CHECKING:
    from envace.types import Task

__all__ = ["bfcl_data_dir", "bfcl_module", "cache_dir", "run_multi_turn_checker"]


@dataclass(frozen=True)
class _ModelConfig:
    """What the checkers read of a model's config: only ``underscore_to_dot``."""

    underscore_to_dot: bool = False


class _AnyModel(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> _ModelConfig:
        return _ModelConfig()


@cache
def _install_stub() -> None:
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(cache_dir() / "bfcl"))
    Path(os.environ["BFCL_PROJECT_ROOT"]).mkdir(parents=True, exist_ok=True)
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)
        stub.MODEL_CONFIG_MAPPING = _AnyModel()  # type: ignore[attr-defined]
        sys.modules[name] = stub


def bfcl_module(name: str) -> Any:
    """Import ``bfcl_eval.<name>`` with the offline stand-ins in place.

    >>> bfcl_module("eval_checker.ast_eval.ast_checker").__name__
    'bfcl_eval.eval_checker.ast_eval.ast_checker'
    """
    _install_stub()
    return importlib.import_module(f"bfcl_eval.{name}")


def bfcl_data_dir() -> Path:
    """The folder of the benchmark's JSON files inside the installed wheel."""
    _install_stub()
    return Path(bfcl_module("constants.eval_config").PROMPT_PATH)


def run_multi_turn_checker(task: Task, decoded: list[list[list[str]]], gold: list[list[str]]) -> dict[str, Any]:
    """bfcl-eval's ``multi_turn_checker`` on call strings (per turn, per step), under a fresh model
    name whose module-global API instances are deleted afterwards; the checker's own exceptions
    become an invalid verdict."""
    checker = bfcl_module("eval_checker.multi_turn_eval.multi_turn_checker")
    store = vars(bfcl_module("eval_checker.multi_turn_eval.multi_turn_utils"))
    model_name = f"envace_{uuid.uuid4().hex}"
    env = task.env or {}
    entry = {"id": task.id, "initial_config": env["initial_config"], "involved_classes": env["involved_classes"]}
    try:
        result: dict[str, Any] = checker.multi_turn_checker(decoded, gold, entry, task.category, model_name)
        return result
    except Exception as exc:  # the checker's own asserts
        return {
            "valid": False,
            "error_type": "multi_turn:checker_raised",
            "error_message": f"{type(exc).__name__}: {exc}",
        }
    finally:
        prefix = re.sub(r"[-./:]", "_", model_name)
        for key in [k for k in store if k.startswith(prefix)]:
            del store[key]
