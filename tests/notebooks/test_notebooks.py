"""Notebooks are stored without outputs and run top to bottom on a real run's events."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from envace.cli import lightning_cli

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_notebooks_are_stored_without_outputs() -> None:
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.slow  # a smoke fit, then the notebook in a fresh kernel
def test_fidelity_curves_notebook_plots_a_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the config's relative runs/ folder lands in tmp
    lightning_cli(["fit", "--config", str(ROOT / "configs" / "smoke.yaml")])
    figure = tmp_path / "curves.png"
    monkeypatch.setenv("ENVACE_RUN", str(tmp_path))
    monkeypatch.setenv("ENVACE_FIGURE", str(figure))
    nb = nbformat.read(ROOT / "notebooks" / "fidelity_curves.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "scalar tags" in printed
    assert figure.stat().st_size > 10_000
