"""Notebooks are stored without outputs and run top to bottom on a real run's events."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_notebooks_are_stored_without_outputs() -> None:
    assert NOTEBOOKS
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.slow  # a smoke fit (shared), then the notebook in a fresh kernel
def test_fidelity_curves_notebook_plots_a_run(smoke_fit: SimpleNamespace, tmp_path: Path, monkeypatch) -> None:
    figure = tmp_path / "curves.png"
    monkeypatch.setenv("ENVACE_RUN", str(smoke_fit.dir))
    monkeypatch.setenv("ENVACE_FIGURE", str(figure))
    nb = nbformat.read(ROOT / "notebooks" / "fidelity_curves.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "scalar tags" in printed
    assert figure.stat().st_size > 10_000
    figures = [c for c in nb.cells if "figure" in c.metadata.get("tags", [])]
    assert len(figures) == 2
    for cell in figures:  # shown inline (no Agg backend): each figure cell displays its image
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert len(images) == 1, cell.source[:80]
    headline = figures[0].source
    for key in ("train/sft/loss", "val/committed/official_success/", "val/imagined/fidelity_gold/"):
        assert key in headline, key
