"""The shop example's committed tasks: every split holds each request kind in equal shares, the test
split orders held-out products in every kind, and the files are what ``make_tasks.py`` writes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

SHOP = Path(__file__).resolve().parents[2] / "examples" / "shop_mcp"


def _rows(folder: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]


def _held_out() -> set[str]:
    sys.path.insert(0, str(SHOP))
    try:
        from server import CATALOG  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SHOP))
    return set(sorted(CATALOG)[-2:])


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_every_split_holds_every_kind_in_equal_shares(split: str) -> None:
    kinds = Counter(r["metadata"]["category"] for r in _rows(SHOP / "tasks", split))
    assert set(kinds) == {"price", "order", "status", "cancel"}
    assert max(kinds.values()) - min(kinds.values()) <= 1, kinds


def test_held_out_products_are_ordered_in_test_only_and_in_every_ordering_kind() -> None:
    held = _held_out()

    def skus(row: dict) -> set[str]:
        return {c["arguments"]["sku"] for c in row["gold"][0] if "sku" in c["arguments"]}

    for split in ("train", "val"):
        assert not any(skus(r) & held for r in _rows(SHOP / "tasks", split))
    unseen = Counter(r["metadata"]["category"] for r in _rows(SHOP / "tasks", "test") if skus(r) & held)
    assert {"order", "status", "cancel"} <= set(unseen), unseen


def test_the_committed_tasks_are_what_the_generator_writes(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "make_tasks.py", "--out", str(tmp_path)], cwd=SHOP, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    for split in ("train", "val", "test"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (SHOP / "tasks" / f"{split}.jsonl").read_text()
