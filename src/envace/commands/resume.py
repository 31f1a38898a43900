"""``--ckpt_path last``: the run's latest ``last.ckpt``, or a one-line refusal; never a silent restart.

Lightning resolves ``last`` in the folder its ``ModelCheckpoint`` writes *this* run to. A logger
without a fixed ``version`` (``configs/smoke.yaml``, most user configs) gives every fit a new
``<save_dir>/<name>/version_<N>/`` folder, so the resumed fit looks in an empty folder, warns, and
trains from step 0 with exit status 0. :func:`resolve_last` replaces ``last`` before the fit
starts, per ``ModelCheckpoint`` callback:

* an explicit ``dirpath``: that folder;
* checkpoints in the logger's folder, a fixed (string) ``version``: ``<save_dir>/<name>/<version>/checkpoints``
  (another version is another run: an arm of ``configs/arms/`` is never resumed from another's);
* a numbered ``version`` (``version_<N>``, Lightning's own numbering): the newest ``version_<k>``,
  ``k <= N``, whose ``checkpoints`` folder holds one;
* no logger: ``<default_root_dir>/checkpoints``.

In a folder, a last checkpoint is what Lightning writes (``last.ckpt``, ``last-v1.ckpt``; a folder
for a distributed one); the newest by modification time wins, as in Lightning. Nothing found is a
:class:`~envace.commands.errors.UsageError` naming where it looked.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from envace.commands.errors import UsageError

_NUMBERED = re.compile(r"version_(\d+)")


def _last_in(folder: Path, name: str = "last", extension: str = ".ckpt") -> list[Path]:
    """The last checkpoints Lightning's ``ModelCheckpoint`` writes into ``folder`` (``last.ckpt``,
    ``last-v1.ckpt``, a distributed checkpoint's folder of that name)."""
    pattern = re.compile(rf"{re.escape(name)}(-v?\d+)?{re.escape(extension)}")
    return [p for p in folder.iterdir() if pattern.fullmatch(p.name)] if folder.is_dir() else []


def _version_folders(root: Path, newest: int) -> list[Path]:
    """``root/version_<k>`` for ``k <= newest``, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NUMBERED.fullmatch(p.name))]
    return [p for k, p in sorted(found, reverse=True) if k <= newest]


def _candidates(trainer: Any, callback: Any) -> tuple[list[Path], str]:
    """The last checkpoints one ``ModelCheckpoint`` could resume from (best first) and where it looked."""
    name, extension = callback.CHECKPOINT_NAME_LAST, callback.FILE_EXTENSION
    if callback.dirpath is not None:
        folder = Path(callback.dirpath)
        return _last_in(folder, name, extension), str(folder / f"{name}{extension}")
    if not trainer.loggers:
        folder = Path(trainer.default_root_dir) / "checkpoints"
        return _last_in(folder, name, extension), str(folder / f"{name}{extension}")
    logger = trainer.loggers[0]
    root = Path(logger.save_dir if logger.save_dir is not None else trainer.default_root_dir) / str(logger.name)
    version = logger.version
    if isinstance(version, str):
        folder = root / version / "checkpoints"
        return _last_in(folder, name, extension), str(folder / f"{name}{extension}")
    for folder in _version_folders(root, int(version)):  # the newest numbered version that has one
        found = _last_in(folder / "checkpoints", name, extension)
        if found:
            return found, str(folder / "checkpoints" / f"{name}{extension}")
    return [], str(root / "version_*" / "checkpoints" / f"{name}{extension}")


def resolve_last(trainer: Any) -> str:
    """The checkpoint ``--ckpt_path last`` resumes from for ``trainer`` (built, not yet fitted); a
    :class:`UsageError` naming the folders searched when there is none."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    callbacks = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
    if not callbacks:
        raise UsageError(
            "--ckpt_path last: the config has no ModelCheckpoint callback, so no run writes a last.ckpt",
            hint="add lightning.pytorch.callbacks.ModelCheckpoint with save_last: true, or give a .ckpt path",
        )
    found: list[Path] = []
    looked: list[str] = []
    for callback in callbacks:
        paths, where = _candidates(trainer, callback)
        found += paths
        looked.append(where)
    if not found:
        raise UsageError(f"--ckpt_path last: nothing to resume, no checkpoint at {' or '.join(looked)}",
                         hint="drop --ckpt_path to start a new run, or give the .ckpt to resume from")  # fmt: skip
    chosen = max(found, key=lambda p: p.stat().st_mtime)
    print(f"envace: --ckpt_path last -> {chosen}", file=sys.stderr)
    return str(chosen)
