"""A user's plug-ins are checked before anything is built, each failure one line and exit status 2:
a reward's signature and return type on a probe call, a source's rows, an environment module's import,
tool schemas (an unusable one named at load), a server that dies at start; and the current folder
imports as under ``python -m``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from envace.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
SERVER = str(ROOT / "tests" / "envs" / "servers" / "misbehaving.py")
NOTES = "{kind: python, module: own_tools.notes_tools}"
STDERR_TAIL = "(stderr: starting the loans service | opening loans.sqlite | RuntimeError: no database)"
TOOL = {"name": "word_count", "description": "Count.", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # the user's modules (tests/own_tools) import by name
    monkeypatch.chdir(tmp_path)
    row = {"user_turns": ["count"], "gold": [[{"name": "word_count", "arguments": {"text": "a b"}}]]}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "with_tools.jsonl").write_text(json.dumps({**row, "tools": [TOOL]}) + "\n")
    remote = {**TOOL, "parameters": {"type": "object", "properties": {"text": {"$ref": "https://x.org/t.json"}}}}
    (tmp_path / "remote_ref.jsonl").write_text(json.dumps({**row, "tools": [remote]}) + "\n")
    return tmp_path


def fit_error(sources: str, capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(["fit", "--config", SMOKE, "--data.sources", sources, "--data.val_sources", "[]"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (rc, err)
    assert not Path("runs").exists()  # nothing built, no run folder
    return err


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        (f"[{{name: tasks, path: rows.jsonl, env: {NOTES}, reward: 'own_tools.plugins:one_argument'}}]",
         "reward 'own_tools.plugins:one_argument' takes (task: 'Task') -> 'float'; a reward is fn(task, trajectory)"),
        (f"[{{name: tasks, path: rows.jsonl, env: {NOTES}, reward: 'own_tools.plugins:broken'}}]",
         "on a probe episode (task rows-1, no calls): TypeError: own_tools.plugins:broken returned str"),
        ("[{name: 'own_tools.plugins:not_a_list'}]", "source 'own_tools.plugins:not_a_list' returned str"),
        ("[{name: tasks, path: with_tools.jsonl, env: {kind: python, module: own_tools.no_such}}]",
         "tool module 'own_tools.no_such': ModuleNotFoundError: No module named 'own_tools.no_such'"),
        ("[{name: tasks, path: remote_ref.jsonl}]",
         "remote_ref.jsonl:1: tools[0]: tool 'word_count': $ref 'https://x.org/t.json' is remote"),
        (f"[{{name: tasks, path: rows.jsonl, env: {{kind: mcp, server: {{command: {sys.executable}, "
         f"args: [{SERVER}, die_at_start]}}}}}}]", STDERR_TAIL),
    ],
)  # fmt: skip
def test_a_broken_plugin_is_one_line_before_anything_is_built(work: Path, capsys, sources: str, expected: str) -> None:
    assert expected in fit_error(sources, capsys)


def test_the_current_folder_imports_as_under_python_m(work: Path, capsys) -> None:
    (work / "mypkg").mkdir()
    (work / "mypkg" / "__init__.py").write_text("def load(split='all', path=None, **options):\n    return 3\n")
    err = fit_error("[{name: 'mypkg:load'}]", capsys)
    assert "source 'mypkg:load' returned int" in err, err  # imported from here; not "No module named 'mypkg'"
