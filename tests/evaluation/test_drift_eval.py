"""``envace evaluate --drift``: the flag parses (and refuses in one line), the oracle reading the drifted
docs scores full marks under every drift of the tool names, silent renames fail it, and summary.json
records the drift."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envace.envs import DriftSpec
from envace.evaluation import TaskFilter, evaluate
from envace.evaluation.drift import DriftConfig, drift_shorthand, drift_tasks
from envace.evaluation.run import parse

ROOT = Path(__file__).resolve().parents[2]
TASKS = TaskFilter(categories=["multi_turn_base"], task_ids=["multi_turn_base_0", "multi_turn_base_56"],
                   max_user_turns=2)  # fmt: skip


def test_the_flag_and_its_fields_parse() -> None:
    kw = parse(["--config", str(ROOT / "configs/eval/bfcl.yaml"), "--drift", "rename_keys,add_fields",
                "--drift.mode", "silent", "--drift.seed", "3"])  # fmt: skip
    assert kw["drift"] == DriftConfig("rename_keys,add_fields", "silent", 3)
    assert kw["drift"].spec() == DriftSpec(("rename_keys", "add_fields"), "silent", 3)
    assert parse(["--config", str(ROOT / "configs/eval/bfcl.yaml")])["drift"] is None
    assert parse(["--drift.kinds", "[units, rename_tool]"])["drift"].spec().kinds == ("units", "rename_tool")
    assert drift_shorthand(["--drift=units", "--drift", "null"]) == ["--drift.kinds", "units", "--drift=null"]
    assert DriftConfig().spec() is None


def test_a_bad_drift_is_one_line_before_anything_loads() -> None:
    out = subprocess.run([sys.executable, "-m", "envace.cli", "evaluate", "--config", "configs/eval/bfcl.yaml",
                          "--drift", "rename_key", "--quiet", "true"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode != 0 and "unknown drift kind 'rename_key'" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_tasks_without_an_environment_are_refused() -> None:
    from envace.data.sources import load_source

    single = load_source("bfcl-single-turn", split="all", categories=["simple_python"])[:1]
    with pytest.raises(ValueError, match="no real environment to drift"):
        drift_tasks(single, DriftSpec(("units",)))
    with pytest.raises(ValueError, match="does not run under drift"):
        evaluate("bfcl", "oracle", tasks=TaskFilter(categories=["memory_kv"], limit=1),
                 drift=DriftConfig("units"), out=None, quiet=True)  # fmt: skip


@pytest.mark.parametrize("mode", ["documented", "silent"])
def test_the_oracle_under_renamed_tools_and_the_summary(mode: str, tmp_path: Path) -> None:
    drift = DriftConfig("rename_tool,rename_keys,nest_result", mode, seed=1)
    result = evaluate("bfcl", "oracle", tasks=TASKS, drift=drift, out=str(tmp_path), quiet=True)
    assert len(result.items) == 2
    # documented: the oracle calls the names the docs show and the checker reads them back; silent: it
    # calls the names it was trained on, the drifted environment refuses them, and the checker sees it
    assert all(it.success for it in result.items) == (mode == "documented")
    refused = [c for it in result.items for c in it.calls if "was renamed to" in json.dumps(c["response"])]
    assert bool(refused) == (mode == "silent")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["drift"] == {"kinds": ["rename_tool", "rename_keys", "nest_result"], "mode": mode, "seed": 1}
    assert summary["arguments"]["drift"] == {"kinds": "rename_tool,rename_keys,nest_result", "mode": mode, "seed": 1}
    assert any(n.startswith("drift: rename_tool, rename_keys, nest_result") for n in summary["notes"])
    plain = evaluate("bfcl", "oracle", tasks=TASKS, out=str(tmp_path / "plain"), quiet=True)
    assert all(it.success for it in plain.items)
    assert json.loads((tmp_path / "plain" / "summary.json").read_text())["drift"] is None
