"""The parts an evaluation unit keeps as they finish, so that an attempt killed mid-way resumes from them.

A part is the rows of one piece of work, written atomically to ``<parts>/<name>.json`` (:func:`kept_part`).
A split's tasks are cut into chunks of ``evaluation.part_tasks`` (:func:`chunked_part`), each its own
part named after its place in the split and the tasks it holds (:func:`chunk_name`): a part written
under another chunking or for another task list has another name and is never read as this one (but
the very same tasks at the same place, which are the same call).
An evaluation begun before chunks kept a whole split as one part under the bare name; that part, where
found, is read instead of the chunks, and ``part_tasks: null`` keeps the bare name for every split.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any]]


def kept_part(parts: Path | None, name: str, run: Callable[[], Rows]) -> Rows:
    """The rows of one part of an evaluation: read from ``parts/<name>.json`` if an earlier attempt
    finished it, else ``run()``, written there (atomically) before it is returned.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     first = kept_part(Path(d), "test-items", lambda: [{"task_id": "t1", "success": True}])
    ...     again = kept_part(Path(d), "test-items", lambda: 1 / 0)  # finished: not run again
    >>> first == again == [{"task_id": "t1", "success": True}]
    True
    """
    if parts is None:
        return run()
    path = parts / f"{name}.json"
    if path.is_file():
        rows: Rows = json.loads(path.read_text())
        return rows
    rows = run()
    parts.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rows))
    tmp.replace(path)
    return rows


def chunks(total: int, size: int | None) -> list[tuple[int, int]]:
    """``(start, end)`` of each chunk of ``total`` tasks, ``size`` at most each, in order (``None``: one
    chunk; no task: one empty chunk, so that every split is one call at least, as before chunks).

    >>> chunks(250, 100), chunks(250, None), chunks(0, 100)
    ([(0, 100), (100, 200), (200, 250)], [(0, 250)], [(0, 0)])
    """
    if size is None or total == 0:
        return [(0, total)]
    return [(start, min(start + size, total)) for start in range(0, total, size)]


def chunk_name(name: str, ids: list[str], start: int, end: int) -> str:
    """The part of the tasks ``ids[start:end]`` of a split's ``ids``: its place (``end`` excluded), the
    split's size and a digest of the chunk's task ids, so that no other chunk of another chunking or of
    another task list of the same size finds it (a chunk is its own call, seeded at its start: the same
    tasks at the same place are the same part whatever chunks surround them).

    >>> chunk_name("test-items-reimagine0-n0", ["a", "b", "c"], 2, 3)
    'test-items-reimagine0-n0-tasks0002-0003-of3-2e7d2c03'
    """
    digest = hashlib.sha256("\n".join(ids[start:end]).encode()).hexdigest()[:8]
    return f"{name}-tasks{start:04d}-{end:04d}-of{len(ids)}-{digest}"


def chunked_part(
    parts: Path | None, name: str, ids: list[str], size: int | None, run: Callable[[int, int], Rows]
) -> Rows:
    """The rows of a split's part ``name`` over its tasks ``ids``: ``run(start, end)`` on each chunk of
    ``size`` tasks (:func:`chunks`), each kept as its own part (:func:`chunk_name`), concatenated in
    order; the whole split as the one part ``name`` where ``size`` is ``None`` or an earlier attempt
    (before chunks) finished that part.

    >>> import tempfile
    >>> ran = []
    >>> def run(start, end):
    ...     ran.append((start, end))
    ...     return [{"task_id": i} for i in "abc"[start:end]]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     rows = chunked_part(Path(d), "test-items", list("abc"), 2, run)
    ...     again = chunked_part(Path(d), "test-items", list("abc"), 2, lambda *a: 1 / 0)  # every chunk kept
    ...     _ = chunked_part(Path(d), "test-items", list("abc"), 1, run)  # another chunking: its own parts
    >>> rows == again == [{"task_id": "a"}, {"task_id": "b"}, {"task_id": "c"}], ran  # (2, 3): the same chunk
    (True, [(0, 2), (2, 3), (0, 1), (1, 2)])
    """
    if size is None or (parts is not None and (parts / f"{name}.json").is_file()):
        return kept_part(parts, name, lambda: run(0, len(ids)))
    rows: Rows = []
    for start, end in chunks(len(ids), size):
        rows += kept_part(parts, chunk_name(name, ids, start, end), partial(run, start, end))
    return rows


def in_split_order(rows: Rows, ids: list[str], categories: list[str]) -> Rows:
    """A split's item rows from its chunks put in the order one ``evaluate`` call on the whole split
    gives them: setting by setting (as the first chunk lists them), then category by category (in the
    order the split's tasks first name them, ``categories[i]`` of ``ids[i]``), then the split's task
    order; a row of a task outside ``ids`` goes last in its setting (the sort is stable).

    >>> rows = [{"setting": s, "task_id": t} for s in ("none", "p@2") for t in ("a", "b")]  # chunk a
    >>> rows += [{"setting": s, "task_id": "c"} for s in ("none", "p@2")]  # chunk c
    >>> [r["setting"] + ":" + r["task_id"] for r in in_split_order(rows, ["a", "b", "c"], ["x", "y", "x"])]
    ['none:a', 'none:c', 'none:b', 'p@2:a', 'p@2:c', 'p@2:b']
    """
    settings = {s: i for i, s in enumerate(dict.fromkeys(r["setting"] for r in rows))}
    ranks = {c: i for i, c in enumerate(dict.fromkeys(categories))}
    place = {t: (ranks[c], i) for i, (t, c) in enumerate(zip(ids, categories, strict=True))}
    last = (len(ranks), len(ids))
    return sorted(rows, key=lambda r: (settings[r["setting"]], *place.get(r["task_id"], last)))
