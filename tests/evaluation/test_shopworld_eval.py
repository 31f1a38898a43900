"""``envace evaluate --benchmark shopworld``: the oracle passes every test task against the real world,
a policy that does nothing passes none, rows per stratum with S1-S4 together and the held-out products
apart; and a fit's data: the warm start grounds ``sources``, RL rolls out ``rl_sources``."""

from __future__ import annotations

from envace.data.datamodule import EnvACEDataModule
from envace.evaluation import TaskFilter, evaluate


def test_the_oracle_passes_every_test_task_and_noop_none() -> None:
    oracle = evaluate("shopworld", "oracle", tasks=TaskFilter(split="test"), out=None, quiet=True)
    rows = {(r.category, r.metric): (r.value, r.n_items) for r in oracle.rows}
    assert rows[("[all]", "success")] == (1.0, 500)
    assert rows[("[S1-S4]", "success")] == (1.0, 400) and rows[("[held_out]", "success")] == (1.0, 150)
    assert all(it.calls and "error" not in str(it.calls[-1]["response"]) for it in oracle.items)
    noop = evaluate("shopworld", "noop", tasks=TaskFilter(split="tune", limit=4), out=None, quiet=True)
    assert {r.value for r in noop.rows} == {0.0} and len(noop.items) == 20  # 4 a stratum


def test_rl_rolls_out_its_own_sources_and_the_warm_start_grounds_the_others() -> None:
    dm = EnvACEDataModule(sources=[{"name": "shopworld", "split": "sft"}], tokenizer="tiny", limit=8,
                          rl_sources=[{"name": "shopworld", "split": "rl"}])  # fmt: skip
    dm.setup()
    assert len(dm.episodes) == 8 and len(dm.train_set) == 2000
    assert {t.extra["split"] for t in dm.train_set} == {"rl"}
