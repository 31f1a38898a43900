"""Where EnvACE keeps converted models and scratch files."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$ENVACE_CACHE``, default ``~/.cache/envace``; created on first use."""
    root = Path(os.environ.get("ENVACE_CACHE", Path.home() / ".cache" / "envace"))
    root.mkdir(parents=True, exist_ok=True)
    return root
