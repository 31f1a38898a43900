"""Import bfcl-eval's checkers offline (DESIGN.md §4).

bfcl-eval is installed ``--no-deps``. Its ``constants.model_config`` imports every vendor client
(openai, anthropic, ...), which we neither have nor need, so a small stand-in module replaces it in
``sys.modules`` before ``ast_checker`` is imported. ``BFCL_PROJECT_ROOT`` points at a writable
cache folder instead of site-packages.

The memory backends (``memory_kv``, ``memory_rec_sum``) import two small packages that bfcl-eval
declares but we do not install: ``overrides`` (only its ``@final`` marker, a no-op at run time) and
``rank_bm25`` (``BM25Plus``, the ranking of ``*_key_search``). When they are missing, stand-ins take
their place: :class:`BM25Plus` scores as rank_bm25 0.2.2 does (tested against it).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
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


class BM25Plus:
    """BM25+ (Lv and Zhai, 2011) over pre-tokenised documents, with rank_bm25's defaults and idf.

    score(q, d) = sum over query tokens t of idf(t) * (delta + tf(t, d) * (k1 + 1) / (k1 * (1 - b + b *
    |d| / avgdl) + tf(t, d))), with idf(t) = ln((N + 1) / df(t)); a token in no document adds 0, and a
    document without t still gets idf(t) * delta. Here idf(a) = ln 3, avgdl = 1.5, and document 0
    gets ln 3 * (1 + 2.5 / (1.5 * (0.25 + 0.75 * 2 / 1.5) + 1)) = ln 3 * 1.8696:

    >>> [round(s, 3) for s in BM25Plus([["a", "b"], ["b"]]).get_scores(["a"])]
    [2.054, 1.099]
    """

    def __init__(self, corpus: list[list[str]], k1: float = 1.5, b: float = 0.75, delta: float = 1.0) -> None:
        self.k1, self.b, self.delta = k1, b, delta
        self.doc_len = [len(doc) for doc in corpus]
        self.avgdl = sum(self.doc_len) / len(corpus)  # an empty corpus raises, as in rank_bm25
        self.doc_freqs = [{t: doc.count(t) for t in set(doc)} for doc in corpus]
        df: dict[str, int] = {}
        for freqs in self.doc_freqs:
            for t in freqs:
                df[t] = df.get(t, 0) + 1
        self.idf = {t: math.log((len(corpus) + 1) / n) for t, n in df.items()}

    def get_scores(self, query: list[str]) -> list[float]:
        scores = [0.0] * len(self.doc_len)
        for t in query:
            idf = self.idf.get(t, 0.0)
            for i, (freqs, length) in enumerate(zip(self.doc_freqs, self.doc_len, strict=True)):
                tf = freqs.get(t, 0)
                norm = self.k1 * (1 - self.b + self.b * length / self.avgdl) + tf
                scores[i] += idf * (self.delta + tf * (self.k1 + 1) / norm)
        return scores


def _stand_in(name: str, **attrs: Any) -> None:
    """Register a module ``name`` with ``attrs`` unless the real package is installed."""
    if name not in sys.modules and importlib.util.find_spec(name) is None:
        module = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(module, key, value)
        sys.modules[name] = module


@cache
def _install_stub() -> None:
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(cache_dir() / "bfcl"))
    Path(os.environ["BFCL_PROJECT_ROOT"]).mkdir(parents=True, exist_ok=True)
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)
        stub.MODEL_CONFIG_MAPPING = _AnyModel()  # type: ignore[attr-defined]
        sys.modules[name] = stub
    _stand_in("overrides", final=lambda f: f, overrides=lambda f: f)
    _stand_in("rank_bm25", BM25Plus=BM25Plus)


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
