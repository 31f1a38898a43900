"""Your own tools end to end: a plain-function module and a TRL-shaped class each train two steps on
the smoke config; a user source and a user reward named module:function are used by the fit; an
unknown or broken one is one line before anything is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.cli import lightning_cli, main

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
OWN = ROOT / "tests"
TWO_STEPS = ["--model.init_args.warm_start_steps", "1", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
             "--data.val_sources", "[]", "--data.limit", "4"]  # fmt: skip


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(OWN))  # the user's modules (tests/own_tools) import by name
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_plain_functions_with_a_user_source_and_reward_train_two_steps(work: Path, monkeypatch) -> None:
    log = work / "reward.log"
    monkeypatch.setenv("ENVACE_TEST_REWARD_LOG", str(log))
    cli = lightning_cli(
        ["fit", "--config", SMOKE, "--data.sources", "[{name: 'own_tools.plugins:notes_source'}]", *TWO_STEPS]
    )
    assert cli.trainer.global_step == 2
    probe, *scored = log.read_text().split()
    assert probe == "notes-0"  # the preflight's probe call, before anything was built
    assert len(scored) == 2 and all(s.startswith("notes-") for s in scored)  # the RL step's 1 task x G=2 episodes


def test_a_trl_shaped_class_trains_two_steps(work: Path) -> None:
    rows = [
        {"gold": [[{"name": "increment", "arguments": {"by": n}}]], "metadata": {"target": n}} for n in (1, 2, 3, 4)
    ]
    (work / "counter.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = (
        "[{name: tasks, path: counter.jsonl, split: all, options: {reward: python-env, "
        "env: {kind: python, class: 'own_tools.counter_env:CounterEnv'}}}]"
    )
    cli = lightning_cli(["fit", "--config", SMOKE, "--data.sources", source, *TWO_STEPS])
    assert cli.trainer.global_step == 2
    task = cli.datamodule.train_set[0] if hasattr(cli.datamodule, "train_set") else None
    assert task is None or task.user_turns[0].startswith("Increment the counter")


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        ("[{name: 'own_tools.plugins:nope'}]", "data.sources[0].name: data source 'own_tools.plugins:nope': module"),
        ("[{name: 'no_such_pkg.mod:load'}]", "ModuleNotFoundError: No module named 'no_such_pkg'"),
        ("[{name: 'own_tools.plugins:NOT_CALLABLE'}]", "not callable (int)"),
        ("[{name: taskz}]", "unknown data source 'taskz'; did you mean 'tasks'?"),
        (
            "[{name: tasks, path: x, reward: 'own_tools.plugins:missing'}]",
            "data.sources[0].reward: reward 'own_tools.plugins:missing'",
        ),
        (
            "[{name: tasks, path: x, options: {reward: gold-call}}]",
            "unknown reward 'gold-call'; did you mean 'gold-calls'?",
        ),
    ],
)
def test_an_unknown_or_broken_plugin_is_one_line_before_anything_is_built(
    work: Path, capsys, sources: str, expected: str
) -> None:
    rc = main(["fit", "--config", SMOKE, "--data.sources", sources])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(work.iterdir()) == []  # nothing built, no run folder


def test_a_user_reward_is_checked_when_it_scores(monkeypatch) -> None:
    from envace.rewards import RewardError, compute_reward
    from envace.types import Task, ToolCall, Trajectory

    monkeypatch.syspath_prepend(str(OWN))
    task = Task(
        "notes-0",
        "notes",
        gold=[[ToolCall("word_count", {"text": "a"})]],
        extra={"reward": "own_tools.plugins:called_word_count"},
    )
    assert compute_reward(task, Trajectory(task, [])).score == 0.0
    masked = compute_reward(Task("notes-3", "notes", extra=task.extra), Trajectory(task, []))
    assert masked.masked and "returned None" in masked.details["error"]  # "cannot compute": masked, counted
    broken = Task("b", "notes", extra={"reward": "own_tools.plugins:broken"})
    with pytest.raises(RewardError, match="returned str; a reward returns a float in"):
        compute_reward(broken, Trajectory(broken, []))
