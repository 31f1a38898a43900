"""The plot's lines: item counts per point, intervals as error bars, and equal series kept apart."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from envace.evaluation.report import Row, plot, plot_series


def _rows(values: dict[tuple[str, int], float], n_items: int = 30) -> list[Row]:
    return [Row("bfcl", "[all]", m, n, "accuracy", v, n_items, 0, 0, 0) for (m, n), v in values.items()]


def test_equal_series_are_drawn_apart_with_their_intervals() -> None:
    rows = _rows({("none", 0): 0.4, ("parallel", 2): 0.5, ("sequential", 2): 0.5, ("parallel", 4): 0.6,
                  ("sequential", 4): 0.6})  # fmt: skip
    intervals = {("none", 0): (0.25, 0.55), ("parallel", 2): (0.3, 0.7), ("parallel", 4): (0.45, 0.7)}
    par, seq = plot_series(rows, intervals)
    assert (par.label, par.marker, par.style) == ("parallel", "o", "-")
    assert (seq.label, seq.marker, seq.style) == ("sequential", "s", "--")
    assert par.ys == seq.ys == [40.0, 50.0, 60.0]  # the values are not moved ...
    assert all(a < n < b for a, b, n in zip(par.xs, seq.xs, (0, 2, 4), strict=True))  # ... the points are
    below, above = ([round(e, 9) for e in side] for side in par.err)
    assert (below, above) == ([15.0, 20.0, 15.0], [15.0, 20.0, 10.0])  # percent below and above the value
    assert [round(e, 9) for e in seq.err[0]] == [15.0, 0.0, 0.0]  # no interval: no bar
    assert [r.n_items for r in par.rows] == [30, 30, 30]


def test_plain_only_is_one_series() -> None:
    (only,) = plot_series(_rows({("none", 0): 0.25}))
    assert only.label == "plain" and only.xs == [0.0] and only.ys == [25.0] and only.err == ([0.0], [0.0])


@pytest.mark.skipif(not importlib.util.find_spec("matplotlib"), reason="matplotlib not installed")
def test_plot_writes_a_png(tmp_path: Path) -> None:
    rows = _rows({("none", 0): 0.4, ("parallel", 1): 0.5})
    assert plot(rows, "accuracy", "[all]", tmp_path / "p.png", {("none", 0): (0.2, 0.6)})
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert not plot(rows, "accuracy", "missing", tmp_path / "q.png") and not (tmp_path / "q.png").exists()
