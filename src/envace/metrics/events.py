"""Read a run's TensorBoard scalars back (for notebooks, reports and tests)."""

from __future__ import annotations

from pathlib import Path


def latest_run(root: str | Path) -> Path:
    """The most recently written folder under ``root`` that holds TensorBoard event files."""
    files = sorted(Path(root).rglob("events.out.tfevents*"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files under {root}")
    return files[-1].parent


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every scalar in the event files of ``run_dir`` (recursive)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(Path(run_dir).rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(points) for tag, points in out.items()}
