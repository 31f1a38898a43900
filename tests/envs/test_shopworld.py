"""ShopWorld's world: fixed facts the same in every process, tools that answer errors as data, and
the state-replay oracle the reward is checked against."""

from __future__ import annotations

import subprocess
import sys

from envace.envs.shopworld import MAX_RESULTS, N_PRODUCTS, ShopWorld, by_name, catalogue, final_state


def test_the_catalogue_is_fixed_across_processes() -> None:
    code = "from envace.envs.shopworld import catalogue; print(sorted((p.sku, p.price) for p in catalogue().values()))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert other.stdout.strip() == str(sorted((p.sku, p.price) for p in catalogue().values()))
    assert len(catalogue()) == N_PRODUCTS and len({p.name for p in catalogue().values()}) == N_PRODUCTS
    assert 0.5 < sum(p.in_stock for p in catalogue().values()) / N_PRODUCTS < 0.9


def test_search_puts_the_named_product_first_among_distractors() -> None:
    product = by_name("red classic mug")
    results = ShopWorld().search_products("red classic mug")["results"]
    assert results[0]["sku"] == product.sku and len(results) == MAX_RESULTS
    assert len({r["sku"] for r in results}) == MAX_RESULTS


def test_orders_ids_and_errors() -> None:
    world = ShopWorld()
    world.reset(orders=[{"order_id": "B12345", "sku": "XXXX", "quantity": 2}])
    sku = next(p.sku for p in catalogue().values() if p.in_stock)
    out_of_stock = next(p.sku for p in catalogue().values() if not p.in_stock)
    assert world.place_order(sku, 2)["order_id"] == "A1001"
    assert world.place_order(out_of_stock, 1) == {"error": "OUT_OF_STOCK", "sku": out_of_stock}
    assert world.place_order(sku.lower(), 1)["error"] == "UNKNOWN_SKU"
    assert world.place_order(sku, 12)["error"] == "INVALID_QUANTITY"
    assert world.cancel_order("A1001") == {"order_id": "A1001", "status": "cancelled"}
    assert world.cancel_order("A1001")["error"] == "NOT_CANCELLABLE"
    assert world.order_status("A1002")["error"] == "UNKNOWN_ORDER"
    assert [o["order_id"] for o in world.list_orders()["orders"]] == ["B12345", "A1001"]


def test_each_episode_starts_from_its_own_hidden_state() -> None:
    a, b = ShopWorld(), ShopWorld()
    a.reset(orders=[{"order_id": "B1", "sku": "S", "quantity": 1}])
    b.reset()
    assert a.list_orders()["orders"] and not b.list_orders()["orders"]


def test_the_oracle_counts_refused_writes_and_successful_reads_only() -> None:
    sku = next(p.sku for p in catalogue().values() if p.in_stock)
    state = final_state([("order_status", {"order_id": "A1001"}), ("place_order", {"sku": sku, "quantity": 1}),
                         ("order_status", {"order_id": "A1001"}), ("cancel_order", {"order_id": "nope"}),
                         ("no_such_tool", {}), ("place_order", {"sku": sku, "quantity": "1"})])  # fmt: skip
    assert state["reads"] == [("order_status", {"order_id": "A1001"})]
    assert state["refused_writes"] == 2 and list(state["book"]) == ["A1001"]
