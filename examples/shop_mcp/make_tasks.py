"""Generate the shop example's tasks with gold calls: ``examples/shop_mcp/tasks/{train,val,test}.jsonl``.

    python examples/shop_mcp/make_tasks.py [--n 300] [--seed 0]

Four kinds of request, one user turn each: a price question (``search_products``), an order
(``place_order``), an order then its status, an order then its cancellation (the second call
reuses the id the first one's response assigns: ``A1001`` in a fresh session). Split 70/15/15 by
task; the kinds cycle within each split (every split holds each kind in equal shares), and half of
the test split's tasks, in every kind, order products held out of training (unseen SKUs).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from server import CATALOG, FIRST_ORDER  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
KINDS = ("price", "order", "status", "cancel")
SYSTEM = "You are the shop's assistant. Use the tools to answer; reuse the ids the tools return."


def request(kind: str, sku: str, qty: int, rng: random.Random) -> tuple[str, list[dict]]:
    name = CATALOG[sku][0]
    oid = f"A{FIRST_ORDER}"
    order = {"name": "place_order", "arguments": {"sku": sku, "quantity": qty}}
    if kind == "price":
        words = " ".join(name.split(",")[0].split()[:2])
        ask = rng.choice(["How much is the {n}?", "What does the {n} cost?", "Find the {n} for me."]).format(n=words)
        return ask, [{"name": "search_products", "arguments": {"query": words}}]
    if kind == "order":
        ask = rng.choice(["Please order {q} of {s}.", "I want {q} x {s}.", "Buy {q} of product {s} for me."])
        return ask.format(q=qty, s=sku), [order]
    if kind == "status":
        ask = rng.choice(
            ["Order {q} of {s}, then check that order's status.", "Buy {q} x {s} and tell me the order status."]
        )
        return ask.format(q=qty, s=sku), [order, {"name": "order_status", "arguments": {"order_id": oid}}]
    ask = rng.choice(
        ["Order {q} of {s}, then cancel that order.", "Place an order for {q} x {s} and cancel it right away."]
    )
    return ask.format(q=qty, s=sku), [order, {"name": "cancel_order", "arguments": {"order_id": oid}}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "tasks")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    skus = sorted(CATALOG)
    held_out = set(skus[-2:])  # test: two products never ordered in training
    rows: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for i in range(args.n):
        split = "train" if i % 20 < 14 else "val" if i % 20 < 17 else "test"
        k = len(rows[split])  # cycles counted within the split: a global i % 4 aliases with i % 20
        pool = sorted(held_out) if split == "test" and k // 4 % 2 == 0 else [s for s in skus if s not in held_out]
        kind = KINDS[k % 4]
        text, gold = request(kind, rng.choice(pool), rng.randint(1, 5), rng)
        rows[split].append(
            {
                "id": f"shop-{i:04d}",
                "user_turns": [text],
                "gold": [gold],
                "system_prompt": SYSTEM,
                "metadata": {"category": kind},
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    for split, items in rows.items():
        with (args.out / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in items)
        print(f"{args.out / f'{split}.jsonl'}: {len(items)} tasks")


if __name__ == "__main__":
    main()
