"""``envace evaluate``: configs parse, a sweep writes its table, items (with the text the policy
wrote), plot and a summary that names what reproduces it, one seed gives one table, and a run
reports its progress on stderr at least every 10 s."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

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


def test_names_of_the_five_configs() -> None:
    assert [p.stem for p in CONFIGS] == ["bfcl", "finmcp", "shopworld", "tau2", "vitabench"]


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
    again = [json.loads(line) for line in (tmp_path / "b" / "items.jsonl").read_text().splitlines()]
    # the text the policy wrote: one act turn (max_steps_per_turn 1), 6 tokens, the same for one seed
    assert all(len(it["texts"]) == 1 and it["texts"][0] for it in items) and [i["texts"] for i in items] == [
        i["texts"] for i in again
    ]
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert set(summary["seconds"]) == {"none-0", "parallel-1", "sequential-1"} and summary["notes"]
    args = summary["arguments"]
    assert args["model"]["tool_style"] == "compact" and args["limits"]["max_new_tokens"] == 6 and args["seed"] == 0
    assert args["tasks"]["task_ids"] == ["multi_turn_base_105"] and summary["task_ids"] == ["multi_turn_base_105"]
    loaded = {"name": "tiny", "reference": False, "checkpoint": None, "chat_format": "auto", "format": "HermesFormat",
              "tool_style": "compact", "dtype": "torch.float32"}  # fmt: skip
    assert summary["policy"] == loaded
    assert summary["seeds"] == [0] and summary["headline"] == {"metric": "accuracy", "category": "[overall_evaluated]"}
    assert {"python", "envace", "torch", "transformers", "peft", "lightning"} <= set(summary["versions"])
    assert summary["versions"]["torch"] == torch.__version__
    assert summary["git"] is None or len(summary["git"]["commit"]) == 40
    assert set(summary["intervals"]) == {"none-0", "parallel-1", "sequential-1"}
    assert all(0.0 <= iv["lo"] <= iv["hi"] <= 1.0 for iv in summary["intervals"].values())
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "a" / PLOT_FILE).stat().st_size > 1000


def test_single_setting_and_reference_limits() -> None:
    result = evaluate("bfcl", "oracle", tasks=TaskFilter(categories=["multi_turn_long_context"], limit=1),
                      limits=RolloutLimits(max_new_tokens=4, max_episode_tokens=64),
                      imagination=ImaginationConfig("sequential", 1), out=None, quiet=True)  # fmt: skip
    assert [(r.mode, r.n) for r in result.rows][:1] == [("sequential", 1)]
    assert result.items[0].success  # reference policies are not held to token limits


def test_a_loaded_policy_gives_the_episodes_of_its_name() -> None:
    """The experiment's eval unit loads its policy once and passes it to every ``evaluate``."""
    from envace.evaluation import load_eval_policy

    tasks, limits = TaskFilter(task_ids=["multi_turn_base_105"], max_user_turns=1), RolloutLimits(max_new_tokens=6)
    by_name = evaluate("bfcl", "tiny", tasks=tasks, limits=limits, out=None, quiet=True)
    loaded = evaluate("bfcl", load_eval_policy("tiny"), tasks=tasks, limits=limits, out=None, quiet=True)
    episodes = [[(i.task_id, i.calls, i.score) for i in r.items] for r in (by_name, loaded)]
    assert episodes[0] == episodes[1]
    assert by_name.items and loaded.rows == by_name.rows


def _lines_with_times(argv: list[str], timeout: float) -> tuple[int, list[tuple[float, str]]]:
    """Run ``argv``; every stderr line with the time it arrived."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    got: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            got.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        proc.kill()
    reader.join(timeout=10)
    return rc, got


def test_progress_on_stderr_at_least_every_10_s(tmp_path: Path) -> None:
    """The acceptance check of a silent run: ``envace evaluate`` on two items with the tiny model
    writes a line for every item of every setting (``--progress_every 0``: per item) and never
    goes 10 s without a line from its first line to its exit."""
    exe = Path(sys.executable).parent / "envace"
    argv = [str(exe), "evaluate", "--benchmark", "bfcl", "--policy", "tiny", "--tasks.categories", "[multi_turn_base]",
            "--tasks.limit", "2", "--tasks.max_user_turns", "1", "--model.tool_style", "compact",
            "--limits.max_new_tokens", "24", "--limits.max_steps_per_turn", "2", "--limits.max_rehearse_tokens", "8",
            "--imagination.n_values", "[0,1]", "--imagination.modes", "[parallel]", "--batch_tasks", "1",
            "--progress_every", "0", "--out", str(tmp_path / "run")]  # fmt: skip
    rc, lines = _lines_with_times(argv, timeout=300)
    texts = [text for _, text in lines]
    assert rc == 0, "\n".join(texts[-20:])
    for setting in ("none n=0 [1/2]", "parallel n=1 [2/2]"):
        for done in ("1/2", "2/2"):
            assert any(t.startswith(f"evaluate bfcl {setting}: {done} items, ") and " item/s, eta " in t for t in texts)
    first = next(i for i, t in enumerate(texts) if t.startswith("[evaluate] bfcl: loading policy tiny"))
    times = [at for at, _ in lines[first:]] + [time.monotonic()]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 10.0, lines
