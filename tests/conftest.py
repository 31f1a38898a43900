"""Shared fixtures: the packaged tokenizer and tiny models built from a config (nothing downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def tokenizer():
    """The packaged SmolLM2 tokenizer (read-only; converted once into the cache)."""
    from envace.policy import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture()
def tiny_model():
    """A fresh 2-layer random Llama over the packaged vocabulary."""
    from envace.policy import PolicySpec, load_model

    return load_model(PolicySpec("tiny"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared test data not found at {SHARED_DATA}")
    return SHARED_DATA
