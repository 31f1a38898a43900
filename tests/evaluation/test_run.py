"""``envace evaluate``: configs parse, a sweep writes its table, items, plot and summary, and one
seed gives one table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from envace.evaluation import TaskFilter, evaluate
from envace.evaluation.report import COLUMNS, PLOT_FILE
from envace.evaluation.run import main, parse
from envace.inference import ImaginationConfig
from envace.rollout import RolloutLimits

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "eval").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_eval_config_parses(config: Path) -> None:
    text = config.read_text()
    assert text.startswith("#") and "envace evaluate" in text.split("\n\n")[0]
    kw = parse(["--config", str(config), "--imagination.mode", "parallel", "--imagination.n", "4"])
    assert kw["benchmark"] == config.stem and kw["imagination"].mode == "parallel" and kw["imagination"].n == 4


def test_names_of_the_four_configs() -> None:
    assert [p.stem for p in CONFIGS] == ["bfcl", "finmcp", "tau2", "vitabench"]


def test_sweep_outputs_and_determinism(tmp_path: Path) -> None:
    argv = ["--benchmark", "bfcl", "--policy", "tiny", "--tasks.task_ids", "[multi_turn_base_105]",
            "--tasks.categories", "[multi_turn_base]", "--tasks.max_user_turns", "1", "--model.tool_style", "compact",
            "--limits.max_new_tokens", "6",
            "--limits.max_steps_per_turn", "1", "--limits.max_rehearse_tokens", "6", "--imagination.n_values", "[0,1]",
            "--imagination.modes", "[parallel,sequential]", "--quiet", "true"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    a, b = (tmp_path / "a" / "table.csv").read_text(), (tmp_path / "b" / "table.csv").read_text()
    assert a == b and a.splitlines()[0] == ",".join(COLUMNS)
    assert (tmp_path / "a" / "table.md").read_text() == (tmp_path / "b" / "table.md").read_text()
    rows = [line.split(",") for line in a.splitlines()[1:] if line.startswith("bfcl,multi_turn_base,")]
    assert [(r[2], r[3]) for r in rows] == [("none", "0"), ("parallel", "1"), ("sequential", "1")]
    imagined_tokens = [int(r[7]) for r in rows]
    assert imagined_tokens[0] == 0 and all(t > 0 for t in imagined_tokens[1:])
    items = [json.loads(line) for line in (tmp_path / "a" / "items.jsonl").read_text().splitlines()]
    assert len(items) == 3 and {it["mode"] for it in items} == {"none", "parallel", "sequential"}
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert set(summary["seconds"]) == {"none-0", "parallel-1", "sequential-1"} and summary["notes"]
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "a" / PLOT_FILE).stat().st_size > 1000


def test_single_setting_and_reference_limits() -> None:
    result = evaluate("bfcl", "oracle", tasks=TaskFilter(categories=["multi_turn_long_context"], limit=1),
                      limits=RolloutLimits(max_new_tokens=4, max_episode_tokens=64),
                      imagination=ImaginationConfig("sequential", 1), out=None, quiet=True)  # fmt: skip
    assert [(r.mode, r.n) for r in result.rows][:1] == [("sequential", 1)]
    assert result.items[0].success  # reference policies are not held to token limits
