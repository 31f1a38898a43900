"""``envace data prepare`` and ``envace data verify``: benchmark tasks to a dataset on disk, gold replay.

::

    envace data prepare --source bfcl-multi-turn --split train --out data/prepared/bfcl-mt-train --grounded true
    envace data verify --source bfcl-multi-turn

A prepared dataset is a Hugging Face :class:`datasets.Dataset` saved with ``save_to_disk``
(``datasets.load_from_disk(out)`` reads it) with typed columns: the task's fields, tools as records,
gold calls, and, when grounded, the conversation as OpenAI chat messages
(:mod:`envace.data.sources.prepared` lists them). ``prepared.json`` beside the data records the
source, split and row count. ``fit`` trains from the folder with the ``prepared`` source
(``{name: prepared, path: <out>}``); the rows read back to tasks and trajectories equal to the
originals. It is written atomically: into a temporary folder next to ``out``, then renamed, so a
failure leaves nothing at ``out``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import jsonargparse
from tqdm import tqdm

from envace.data.grounding import ground
from envace.data.sources import VerifyReport, load_source, verify_source
from envace.data.sources.prepared import MANIFEST, features, task_row, trajectory_row
from envace.data.sources.schema import check_gold
from envace.types import Task


def task_dataset(tasks: list[Task], grounded: bool = False) -> datasets.Dataset:
    """The prepared dataset of ``tasks`` (grounding each one in its real environment if asked)."""
    rows = []
    for task in tqdm(tasks, desc="ground" if grounded else "tasks", unit="task", leave=False):
        row = task_row(task)
        if grounded:
            row |= trajectory_row(ground(task), task)
        rows.append(row)
    return datasets.Dataset.from_list(rows, features=features(grounded))


def save_atomic(
    dataset: datasets.Dataset, out: str | Path, overwrite: bool = False, manifest: dict[str, Any] | None = None
) -> Path:
    """``dataset.save_to_disk(out)`` all or nothing: a temporary sibling folder, then ``os.replace``.

    Args:
        dataset: what to save.
        out: the target folder.
        overwrite: replace an existing ``out`` (it is kept if anything fails).
        manifest: written as ``prepared.json`` in the folder.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        dataset.save_to_disk(str(tmp / "new"))
        if manifest is not None:
            (tmp / "new" / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            os.replace(out, tmp / "old")
        try:
            os.replace(tmp / "new", out)
        except OSError:
            if (tmp / "old").exists():
                os.replace(tmp / "old", out)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _valid_gold(tasks: list[Task], drop: bool) -> tuple[list[Task], list[str]]:
    """The tasks whose gold calls all fit their tools' schemas (:func:`check_gold`); any other task
    refuses the source (a one-line ``ValueError``) or, with ``drop``, is left out, named on stderr."""
    kept, left_out = [], []
    for task in tasks:
        try:
            check_gold(task)
        except ValueError as exc:
            if not drop:
                raise ValueError(f"{exc}; pass --drop_invalid_gold true to leave such tasks out") from None
            print(f"left out: {exc}", file=sys.stderr)
            left_out.append(task.id)
            continue
        kept.append(task)
    return kept, left_out


def prepare(
    source: str,
    split: str,
    out: str,
    path: str | None = None,
    limit: int | None = None,
    grounded: bool = False,
    overwrite: bool = False,
    drop_invalid_gold: bool = False,
) -> str:
    """Load a benchmark source and save its tasks as a dataset folder.

    Args:
        source: a registered source (``bfcl-multi-turn``, ``bfcl-single-turn``, ``tau2``, ...).
        split: ``train``, ``test`` or ``all``.
        out: the folder to write (``datasets`` ``save_to_disk`` layout), written atomically.
        path: the source's own data location; default: the packaged copy.
        limit: keep only the first ``limit`` tasks (at least 1).
        grounded: replay each task's gold in its real environment and add the conversation
            (``messages``, ``calls``, ``trajectory_source``).
        overwrite: replace ``out`` if it exists.
        drop_invalid_gold: leave out (each named on stderr, listed in ``prepared.json``) the tasks whose
            gold calls break their tool's schema, instead of refusing the source
            (:mod:`envace.data.sources.schema`; BFCL's official test split holds five).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}: an empty dataset is never written")
    tasks = load_source(source, split=split, path=path)
    if not tasks:  # an empty input is an error, not an empty dataset that fails later
        raise ValueError(f"source {source!r} has no {split!r} tasks{f' in {path}' if path else ''}; nothing written")
    if limit is not None:
        tasks = tasks[:limit]
    tasks, left_out = _valid_gold(tasks, drop_invalid_gold)
    if not tasks:
        raise ValueError(f"every {source!r} {split!r} task has gold that breaks its tool's schema; nothing written")
    dataset = task_dataset(tasks, grounded=grounded)
    record = {
        "source": source,
        "split": split,
        "path": path,
        "limit": limit,
        "grounded": grounded,
        "rows": len(dataset),
        "left_out": left_out,
    }
    save_atomic(dataset, out, overwrite=overwrite, manifest=record)
    print(f"wrote {len(dataset)} {source}/{split} tasks to {out}")
    return str(out)


def format_report(report: VerifyReport) -> str:
    """Per-group and total pass counts, then one line per failure."""
    width = max([len(g) for g in report.per_group] + [5])
    lines = [f"{g:<{width}}  {p}/{t}" for g, (p, t) in report.per_group.items()]
    lines.append(f"{'total':<{width}}  {report.passed}/{report.total}")
    lines += [f"FAIL {f.get('id', '?')}: {f.get('reason', '')}" for f in report.failures]
    if report.notes:
        n = len(report.notes)
        lines.append(f"note: {n} gold calls break their tool docs (run as the official harness runs them):")
        lines += [f"  {n['id']}: {n['gold_breaks_schema']}" for n in report.notes]
    return "\n".join(lines)


def verify(
    source: str = "bfcl-multi-turn", split: str = "all", path: str | None = None, limit: int | None = None
) -> VerifyReport:
    """Replay a source's gold in its real environment and official checker; print the pass counts.

    Args:
        source: a source with a verifier (``bfcl-multi-turn``, ``tau2``).
        split: ``train``, ``test`` or ``all``.
        path: the source's own data location; default: the packaged copy.
        limit: check only the first ``limit`` tasks of each group.
    """
    kw: dict[str, Any] = {} if limit is None else {"limit": limit}
    start = time.perf_counter()
    report = verify_source(source, split=split, path=path, **kw)
    print(format_report(report))
    print(f"{time.perf_counter() - start:.1f} s")
    return report


def data_main(argv: list[str] | None = None) -> int:
    """``envace data <prepare|verify> ...``; exit status 1 when a verification has failures."""
    result = jsonargparse.CLI([prepare, verify], args=argv, as_positional=False, prog="envace data")
    if isinstance(result, VerifyReport):
        return 0 if result.passed == result.total else 1
    return 0
