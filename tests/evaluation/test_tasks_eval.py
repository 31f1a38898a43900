"""``envace evaluate --benchmark tasks``: a split of a fit config's own tasks, run against its real
environment (the shop's MCP server; Python tools) and scored by the reward the fit names, a user's
own ``package.module:function`` included (its ``None`` masks the item, never scores it 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.commands.evaluate import main
from envace.commands.fit_config import fit_source
from envace.evaluation import TaskFilter, evaluate

ROOT = Path(__file__).resolve().parents[2]
SHOP = str(ROOT / "configs" / "mcp_example.yaml")


def _rows(result) -> dict[tuple[str, str], tuple[float, int]]:
    return {(r.category, r.metric): (r.value, r.n_items) for r in result.rows}


def test_the_oracle_passes_the_shops_test_tasks_against_its_server_and_noop_none() -> None:
    pick = TaskFilter(split="test", limit=1, path=SHOP)  # one task of each of the four kinds
    oracle = evaluate("tasks", "oracle", tasks=pick, out=None, quiet=True, source=fit_source(SHOP))
    rows = _rows(oracle)
    assert rows[("[all]", "success")] == (1.0, 4) and rows[("[all]", "score")] == (1.0, 4)
    assert {it.category for it in oracle.items} == {"price", "order", "status", "cancel"}
    assert all(it.details["reward"] == "gold-calls" for it in oracle.items)  # the fit config's reward
    assert all(it.task_id.startswith("shop-") for it in oracle.items)
    responses = [c["response"] for it in oracle.items for c in it.calls]
    assert responses and not any("error" in r for r in responses)  # the real server answered each call
    noop = evaluate("tasks", "noop", tasks=pick, out=None, quiet=True, source=fit_source(SHOP))
    assert _rows(noop)[("[all]", "success")] == (0.0, 4)


@pytest.fixture()
def notes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fit config whose source and reward are a user's own (tests/own_tools, imported by name)."""
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    path = tmp_path / "fit.yaml"
    path.write_text("data:\n  sources:\n    - {name: 'own_tools.plugins:notes_source', split: train}\n")
    return str(path)


def test_a_users_own_reward_scores_and_its_none_masks(notes: str) -> None:
    result = evaluate("tasks", "oracle", tasks=TaskFilter(), out=None, quiet=True, source=fit_source(notes))
    scores = {it.task_id: it.score for it in result.items}
    assert scores == {"notes-0": 1.0, "notes-1": 1.0, "notes-2": 1.0, "notes-3": None}
    assert _rows(result)[("all", "success")] == (1.0, 4)  # three scored, the masked one left out


def test_a_model_policy_from_the_command_line(notes: str, tmp_path: Path) -> None:
    argv = ["--benchmark", "tasks", "--policy", "tiny", "--tasks.path", notes,
            "--tasks.task_ids", "[notes-0]", "--limits.max_new_tokens", "8", "--limits.max_steps_per_turn", "1",
            "--limits.max_rehearse_tokens", "8", "--quiet", "true", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 0
    table = (tmp_path / "out" / "table.csv").read_text()
    assert "\ntasks,all,none,0,success,0.0,1,0,8,0\n" in table  # the random model wrote 8 tokens, no call


@pytest.mark.parametrize(
    ("path", "says"),
    [(None, "pass --tasks.path"), ("nowhere.yaml", "nowhere.yaml"), ("model: {}", "no data.sources"),
     ("data: data.yaml", "data.yaml")],
)  # fmt: skip
def test_a_missing_or_wrong_config_is_one_line(tmp_path: Path, path: str | None, says: str) -> None:
    if path is not None and ":" in path:  # a config's text
        text, path = path, str(tmp_path / "fit.yaml")
        Path(path).write_text(text + "\n")
    with pytest.raises(ValueError, match=says) as err:
        fit_source(path)
    assert "\n" not in str(err.value)


def test_the_fit_config_is_read_as_envace_fit_reads_it(tmp_path: Path, notes: str) -> None:
    """A data section in a file of its own and a dotted override reach the tasks, as in ``envace fit``
    (a raw YAML read saw neither)."""
    (tmp_path / "data.yaml").write_text("sources:\n  - {name: 'own_tools.plugins:notes_source', split: train}\n")
    (tmp_path / "split.yaml").write_text("data: data.yaml\n")
    assert fit_source(str(tmp_path / "split.yaml")).name == "own_tools.plugins:notes_source"
