"""What a result needs to be reproduced: the checkpoint it came from, how the policy was rendered,
the package versions, and the source commit.

* :func:`checkpoint_info` reads a Lightning checkpoint's step and the chat format and tool style it
  was trained with (``checkpoint["envace"]``, which the training module writes, else its
  ``hyper_parameters`` or the data module's ``datamodule_hyper_parameters``, which the CLI links to
  the model's);
* :func:`settle` picks the setting to use: the one asked for, else the checkpoint's, else the
  default; when the two disagree it says so in one line and uses the one asked for;
* :func:`versions` and :func:`git_commit` (a bounded ``git`` call; ``None`` outside a git tree).
"""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGES = ("envace", "torch", "transformers", "peft", "lightning", "bfcl-eval", "numpy")
#: the values a checkpoint's setting may take (another value, or another type, counts as not saved)
KNOWN = {"tool_style": ("json", "compact"), "chat_format": ("auto", "template", "hermes")}
GIT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint's identity and the rendering it was trained with (``None``: not saved in it)."""

    path: str
    global_step: int | None = None
    epoch: int | None = None
    base: str | None = None
    tool_style: str | None = None
    chat_format: str | None = None


def _saved(ckpt: dict[str, Any], key: str) -> str | None:
    for where in ("envace", "hyper_parameters", "datamodule_hyper_parameters"):
        section = ckpt.get(where)
        value = section.get(key) if isinstance(section, dict) else None
        if value in KNOWN[key]:
            return str(value)
    return None


def checkpoint_info(path: str, ckpt: dict[str, Any], base: str | None = None) -> CheckpointInfo:
    """The identity of the checkpoint ``ckpt`` read from ``path`` (``base``: the model its weights load into)."""
    step, epoch = ckpt.get("global_step"), ckpt.get("epoch")
    return CheckpointInfo(
        path=str(Path(path).resolve()),
        global_step=step if isinstance(step, int) else None,
        epoch=epoch if isinstance(epoch, int) else None,
        base=base,
        tool_style=_saved(ckpt, "tool_style"),
        chat_format=_saved(ckpt, "chat_format"),
    )


def settle(key: str, asked: str | None, info: CheckpointInfo | None, default: str) -> str:
    """The value of setting ``key``: ``asked`` when given, else the checkpoint's, else ``default``.

    An ``asked`` value the checkpoint contradicts is used, with a one-line warning on stderr that
    names both.
    """
    saved = getattr(info, key) if info is not None else None
    if asked is None:
        return saved or default
    if saved is not None and saved != asked:
        print(f"envace: warning: {key} {asked!r} was asked for, but {info.path if info else ''} was trained with "
              f"{key} {saved!r}; using {asked!r} (omit the option to use the checkpoint's)",
              file=sys.stderr, flush=True)  # fmt: skip
    return asked


def versions() -> dict[str, str | None]:
    """Python and the installed versions of :data:`PACKAGES` (``None``: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(where: Path | None = None) -> dict[str, Any] | None:
    """The commit of the git tree holding ``where`` (default: this package's source) and whether
    tracked files other than experiment results (``studies/``, and the weights in ``docs/experiments``,
    which a running grid writes) differ from it; ``None`` outside a git tree or without git (each call bounded)."""
    cwd = where or Path(__file__).resolve().parent
    commit = _git(["rev-parse", "HEAD"], cwd)
    if not commit:
        return None
    results = [":(top,exclude)docs/experiments", ":(top,exclude)studies"]
    status = _git(["status", "--porcelain", "--untracked-files=no", "--", ":(top)", *results], cwd)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}
