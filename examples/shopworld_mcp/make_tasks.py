"""Write ShopWorld's tasks as own-tools task files: ``examples/shopworld_mcp/tasks/<split>.jsonl``.

    python examples/shopworld_mcp/make_tasks.py                       # tune and test (committed)
    python examples/shopworld_mcp/make_tasks.py --splits sft rl --out ~/.cache/envace/shopworld_mcp

Each row is one task of :mod:`envace.data.sources.shopworld` as it is, nothing drawn here: its id,
its request, its gold calls, and in ``metadata`` what the reward and the world need — ``category``
(the stratum), ``scored_tools`` (what ``gold-writes`` scores), ``held_out`` (test's held-out
products) and, in S5_control, ``orders``: the world's hidden state, ``ShopWorld.reset``'s keyword
argument, which ``source.py`` hands the task's server on its command line. The system prompt is the
source's, not repeated in every row. Deterministic: the same files in every run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from envace.data.sources.shopworld import SPLITS, load_shopworld
from envace.types import Task

HERE = Path(__file__).resolve().parent


def task_row(task: Task) -> dict[str, Any]:
    """One ShopWorld task as a task file's row (the format of :mod:`envace.data.sources.tasks`)."""
    metadata: dict[str, Any] = {"category": task.category, "scored_tools": list(task.extra["scored_tools"])}
    if task.extra["held_out"]:
        metadata["held_out"] = True
    metadata.update(task.extra["metadata"])  # S5_control: the orders that exist before the episode
    gold = [[call.to_dict() for call in turn] for turn in task.gold]
    return {"id": task.id, "user_turns": list(task.user_turns), "gold": gold, "metadata": metadata}


def write_split(split: str, out: Path) -> Path:
    """``out/<split>.jsonl``: every task of ``split``, one row each, in the source's order."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{split}.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(task_row(t)) + "\n" for t in load_shopworld(split))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", nargs="+", choices=sorted(SPLITS), default=["tune", "test"])
    parser.add_argument("--out", type=Path, default=HERE / "tasks")
    args = parser.parse_args()
    for split in args.splits:
        path = write_split(split, args.out)
        print(f"{path}: {sum(1 for _ in path.open(encoding='utf-8'))} tasks")


if __name__ == "__main__":
    main()
