"""An evaluation unit kept in parts of ``evaluation.part_tasks`` tasks of a split (``experiment.parts``): a
killed one resumes from its finished chunks, the chunks' rows are those of one part per split, a part of
another chunking or another task list is never read, and the parts of evaluations begun before chunks
(one per split, under the bare names) are still read. ``evaluate`` and the gold fidelity are greedy fakes
that count their calls; the tasks are five of two categories, interleaved."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from envace.experiment import evaluate as unit_eval
from envace.experiment.evalspec import EvalSpec
from envace.experiment.grid import ExperimentConfig, units
from envace.types import Task

ROOT = Path(__file__).resolve().parents[2]
TASKS = [Task(f"t{i}", "bfcl", category=("base", "long")[i % 2]) for i in range(5)]


class Fakes:
    """``evaluate`` and ``gold_fidelity`` stubbed, greedy (a row depends on its task and setting only, a
    fidelity row on its task's seed) and counted in ``calls``; ``kill_at`` a task id whose call dies."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tasks: list[Task] = TASKS) -> None:
        import envace.evaluation
        import envace.evaluation.policies

        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.kill_at = ""
        self.tasks = tasks
        monkeypatch.setattr(envace.evaluation, "evaluate", self.evaluate)
        loaded = SimpleNamespace(tokenizer=None, fmt=None)
        monkeypatch.setattr(envace.evaluation.policies, "load_eval_policy", lambda *a, **k: loaded)
        monkeypatch.setattr(unit_eval, "held_out", lambda *a: self.tasks)
        monkeypatch.setattr(unit_eval, "gold_fidelity", self.gold_fidelity)

    def evaluate(self, benchmark: str, policy: Any, *, tasks: Any, imagination: Any, **kw: Any) -> SimpleNamespace:
        """As ``evaluate``'s items: setting by setting, category by category, in the source's order."""
        chosen = [t for t in self.tasks if t.id in set(tasks.task_ids)]
        self.calls.append(("items", tuple(t.id for t in chosen)))
        if self.kill_at in tasks.task_ids:
            raise KeyboardInterrupt  # the session ends here
        by_category = sorted(chosen, key=lambda t: [c.category for c in chosen].index(t.category))
        return SimpleNamespace(items=[_item(t, s.mode, s.n) for s in imagination.settings() for t in by_category])

    def gold_fidelity(
        self, policy: Any, tasks: list[Task], limits: Any, sampling: Any, split: str, layout: str, first: int = 0
    ) -> list[dict[str, Any]]:
        self.calls.append((f"fidelity {layout}", tuple(t.id for t in tasks)))
        if self.kill_at in {t.id for t in tasks}:
            raise KeyboardInterrupt
        return [
            {"split": split, "task_id": t.id, "pairs": 1, "value_f1": (first + i) / 10} for i, t in enumerate(tasks)
        ]


def _item(task: Task, mode: str, n: int) -> SimpleNamespace:
    """An ``ItemResult`` of ``task`` in setting ``mode@n``, decided by both (greedy)."""
    return SimpleNamespace(
        category=task.category,
        task_id=task.id,
        mode=mode,
        n=n,
        success=(int(task.id[1:]) + n) % 3 == 0,
        score=1.0,
        details={},
        turns=1,
        flags=set(),
        calls=[],
        imagination=[],
    )


def _cfg(tmp_path: Path, **evaluation: Any) -> ExperimentConfig:
    spec = EvalSpec(splits=["test"], n_values=[0, 2], modes=["parallel"], **evaluation)
    folders = {"results": str(tmp_path / "r"), "work": str(tmp_path / "w")}
    return ExperimentConfig("x", str(ROOT / "configs/smoke.yaml"), ["envace"], seeds=[0], evaluation=spec, **folders)


def _evaluate(cfg: ExperimentConfig, parts: Path | None) -> dict[str, Any]:
    unit = next(u for u in units(cfg) if u.key == "eval-warm_start")
    return unit_eval.evaluate_unit(cfg, unit, Path("last.ckpt"), parts)


def test_part_tasks_must_be_a_positive_integer_or_null() -> None:
    assert EvalSpec().part_tasks == 100 and EvalSpec(part_tasks=None).part_tasks is None
    for bad in (0, -5, True, 2.5, "10"):
        with pytest.raises(ValueError, match=r"^evaluation.part_tasks must be an integer > 0 \(null: a split is one"):
            EvalSpec(part_tasks=bad)  # type: ignore[arg-type]


def test_a_killed_evaluation_resumes_from_its_finished_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of two of the five tasks: an attempt killed in the items of t2-t3 keeps t0-t1's; the next
    runs only the chunks it lacks, and its result is the one of one part per split (chunks put back in
    the order of one ``evaluate`` call: setting, then category, then task; the fidelity's seeds by task)."""
    fakes = Fakes(monkeypatch)
    cfg, parts = _cfg(tmp_path, part_tasks=2), tmp_path / "parts"
    fakes.kill_at = "t2"
    with pytest.raises(KeyboardInterrupt):
        _evaluate(cfg, parts)
    assert fakes.calls == [("items", ("t0", "t1")), ("items", ("t2", "t3"))] and len(list(parts.glob("*.json"))) == 1
    fakes.calls.clear()
    fakes.kill_at = ""
    resumed = _evaluate(cfg, parts)
    fidelity = [("fidelity call", ids) for ids in (("t0", "t1"), ("t2", "t3"), ("t4",))]
    assert fakes.calls == [("items", ("t2", "t3")), ("items", ("t4",)), *fidelity]
    assert len(list(parts.glob("*.json"))) == 6
    fakes.calls.clear()
    whole = _evaluate(_cfg(tmp_path, part_tasks=None), tmp_path / "whole")
    assert fakes.calls == [("items", ("t0", "t1", "t2", "t3", "t4")), ("fidelity call", ("t0", "t1", "t2", "t3", "t4"))]
    assert resumed["items"] == whole["items"] and resumed["fidelity"] == whole["fidelity"]
    by_category = ["t0", "t2", "t4", "t1", "t3"]
    assert [(r["setting"], r["task_id"]) for r in resumed["items"][:5]] == [("none", t) for t in by_category]
    assert [r["value_f1"] for r in resumed["fidelity"]] == [0.0, 0.1, 0.2, 0.3, 0.4]  # the seeds are the tasks'
    assert _evaluate(cfg, None) == resumed  # without a parts folder: the same chunks, the same rows


def test_a_part_of_another_chunking_or_task_list_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = Fakes(monkeypatch)
    parts = tmp_path / "parts"
    _evaluate(_cfg(tmp_path, part_tasks=2), parts)
    fakes.calls.clear()
    _evaluate(_cfg(tmp_path, part_tasks=3), parts)  # chunks t0-t2, t3-t4: none kept yet
    assert [ids for kind, ids in fakes.calls if kind == "items"] == [("t0", "t1", "t2"), ("t3", "t4")]
    fakes.calls.clear()
    fakes.tasks = [*TASKS[:2], Task("t9", "bfcl", category="base"), *TASKS[3:]]  # as many tasks, t9 for t2
    _evaluate(_cfg(tmp_path, part_tasks=2), parts)
    assert [ids for kind, ids in fakes.calls if kind == "items"] == [("t9", "t3")]  # t0-t1 and t4: the same chunks


def test_part_tasks_null_keeps_a_split_in_one_part_under_its_old_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The names evaluations begun before chunks wrote: an unfinished one resumes from them."""
    fakes = Fakes(monkeypatch)
    parts = tmp_path / "parts"
    cfg = _cfg(tmp_path, part_tasks=None)
    first = _evaluate(cfg, parts)
    assert sorted(p.name for p in parts.iterdir()) == [
        "test-gold-fidelity-call.json",
        "test-items-reimagine0-n0-2.json",
    ]
    fakes.calls.clear()
    assert _evaluate(cfg, parts) == first and fakes.calls == []


def test_an_old_whole_split_part_is_read_under_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluation begun before chunks finished the split's items (not its fidelity): the default
    chunking reads that part instead of its chunks, and chunks the fidelity."""
    fakes = Fakes(monkeypatch)
    parts = tmp_path / "parts"
    old = _evaluate(_cfg(tmp_path, part_tasks=None), parts)
    (parts / "test-gold-fidelity-call.json").unlink()
    rows = json.loads((parts / "test-items-reimagine0-n0-2.json").read_text())
    (parts / "test-items-reimagine0-n0-2.json").write_text(json.dumps([{**r, "old": True} for r in rows]))
    fakes.calls.clear()
    resumed = _evaluate(_cfg(tmp_path, part_tasks=2), parts)
    assert [kind for kind, _ in fakes.calls] == ["fidelity call"] * 3
    assert all(r["old"] for r in resumed["items"]) and resumed["fidelity"] == old["fidelity"]


def test_add_fidelity_goes_through_the_chunked_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--add-fidelity``'s rows (``unit_fidelity``) are kept per chunk, and read from the chunks the
    evaluation kept: a killed addition resumes from its finished chunks."""
    fakes = Fakes(monkeypatch)
    cfg, parts = _cfg(tmp_path, part_tasks=2), tmp_path / "parts"
    unit = next(u for u in units(cfg) if u.key == "eval-warm_start")
    landed = _evaluate(cfg, parts)
    fakes.calls.clear()
    assert unit_eval.unit_fidelity(cfg, unit, Path("last.ckpt"), "call", parts) == landed["fidelity"]
    assert fakes.calls == []
    fakes.kill_at = "t4"
    with pytest.raises(KeyboardInterrupt):
        unit_eval.unit_fidelity(cfg, unit, Path("last.ckpt"), "turn", parts)
    fakes.calls.clear()
    fakes.kill_at = ""
    turn = unit_eval.unit_fidelity(cfg, unit, Path("last.ckpt"), "turn", parts)
    assert fakes.calls == [("fidelity turn", ("t4",))] and [r["layout"] for r in turn] == ["turn"] * 5
    whole = dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, part_tasks=None))
    assert unit_eval.unit_fidelity(whole, unit, Path("last.ckpt"), "turn", None) == turn
