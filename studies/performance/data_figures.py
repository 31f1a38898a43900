"""Measure the DataModule: setup throughput and prompt-token distributions per source; prints JSON.

::

    .venv/bin/python studies/performance/data_figures.py                       # packaged SmolLM2 tokenizer
    .venv/bin/python studies/performance/data_figures.py --vitabench /path/to/vitabench --tokenizer Qwen/Qwen3-8B

(a) ``setup``: tasks per second for a full ``setup()`` of ``bfcl-multi-turn`` train with the warm start on
(load, ground every gold in the real environment, tokenise every grounded episode), the tokenizer loaded
beforehand. (b) ``prompt_tokens``: min / median / p90 / max of the prompt the rollout starts from (system
turn with the tools, tools added at the first turn, first user turn) per source and tool style.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from typing import Any

import jsonargparse

from envace.data.datamodule import EnvACEDataModule
from envace.data.sources import load_source
from envace.types import Task

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def distribution(values: list[int]) -> dict[str, float]:
    """min, median, p90 (nearest rank), max and count of ``values``."""
    s = sorted(values)
    p90 = s[max(0, math.ceil(0.9 * len(s)) - 1)]
    return {"n": len(s), "min": s[0], "median": statistics.median(s), "p90": p90, "max": s[-1]}


def time_setup(tokenizer: str, tool_style: str) -> dict[str, Any]:
    """Time one full warm-start setup of bfcl-multi-turn train."""
    dm = EnvACEDataModule([{"name": "bfcl-multi-turn", "split": "train"}], tokenizer=tokenizer, tool_style=tool_style)
    dm.encoder  # noqa: B018 -- load the tokenizer outside the timed part
    start = time.perf_counter()
    dm.setup("fit")
    seconds = time.perf_counter() - start
    sft_tokens = sum(len(e.input_ids) for e in dm.episodes)
    return {
        "source": "bfcl-multi-turn/train",
        "tool_style": tool_style,
        "tasks": len(dm.train_set),
        "grounded": dm.counts["grounded"],
        "seconds": round(seconds, 2),
        "tasks_per_s": round(len(dm.train_set) / seconds, 1),
        "sft_tokens_per_s": round(sft_tokens / seconds),
        "sft_tokens": dm.stats()["sft_tokens"],
    }


def source_tasks(vitabench: str | None) -> dict[str, list[Task]]:
    """The tasks of every measured source, grouped as reported."""
    groups: dict[str, list[Task]] = {
        "bfcl-single-turn": load_source("bfcl-single-turn", "all"),
        "bfcl-multi-turn": load_source("bfcl-multi-turn", "all"),
    }
    for task in load_source("tau2", "all"):
        groups.setdefault(f"tau2/{task.category}", []).append(task)
    if vitabench and os.path.isdir(vitabench):
        for task in load_source("vitabench", "all", path=vitabench):
            groups.setdefault(f"vitabench/{task.category}", []).append(task)
    return groups


def main(
    tokenizer: str = "smollm2-135m", vitabench: str | None = "/work/shared/data/vitabench", setup_style: str = "json"
) -> dict[str, Any]:
    """Print the figures as JSON.

    Args:
        tokenizer: name or path of the tokenizer to measure with.
        vitabench: the VitaBench data folder (skipped when missing).
        setup_style: tool style of the timed setup.
    """
    out: dict[str, Any] = {"tokenizer": tokenizer, "setup": time_setup(tokenizer, setup_style), "prompt_tokens": {}}
    groups = source_tasks(vitabench)
    for style in ("json", "compact"):
        dm = EnvACEDataModule([], tokenizer=tokenizer, tool_style=style)
        out["prompt_tokens"][style] = {g: distribution([dm.prompt_tokens(t) for t in ts]) for g, ts in groups.items()}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    jsonargparse.CLI(main)
