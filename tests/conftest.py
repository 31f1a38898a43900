"""Shared fixtures: the packaged tokenizer and tiny models built from a config (nothing downloaded)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# the VitaBench copy (MIT) in the shared data beside the repository; ENVACE_VITABENCH points elsewhere
VITABENCH = Path(os.environ.get("ENVACE_VITABENCH") or SHARED_DATA / "vitabench")


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


@pytest.fixture(scope="session")
def vitabench_data() -> Path:
    """The VitaBench folder (``$ENVACE_VITABENCH``, else ``SHARED_DATA / "vitabench"``); skips when absent."""
    if not VITABENCH.exists():
        pytest.skip(f"VitaBench data folder not found at {VITABENCH} (set ENVACE_VITABENCH)")
    return VITABENCH


@pytest.fixture(scope="session")
def smoke_fit(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One fit of configs/smoke.yaml, its validation also run before training (2 warm-start and 2 RL
    steps; about 15 s on two cores), shared by the tests that read a run: ``.dir`` (the events under
    ``runs/``) and ``.cli`` (the LightningCLI that ran it)."""
    from envace.cli import lightning_cli

    smoke = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
    run = tmp_path_factory.mktemp("smoke_fit")
    before = os.getcwd()
    os.chdir(run)  # the config's relative runs/ folder lands here
    try:
        cli = lightning_cli(["fit", "--config", str(smoke), "--trainer.num_sanity_val_steps=-1"])
    finally:
        os.chdir(before)
    return SimpleNamespace(dir=run, cli=cli)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of a bf16 fast path (``@pytest.mark.bf16``, ``@pytest.mark.bf16_prepack``) run where the
    CPU has it and are skipped with the reason elsewhere (``ENVACE_BF16=none`` forces that here);
    the fallbacks are tested on every machine (tests/test_hardware.py)."""
    import torch

    from envace import hardware

    cap = hardware.capability()
    missing = {
        "bf16": None if cap.cpu_bf16 else f"needs native bf16: {cap.reason}",
        "bf16_prepack": None
        if hardware.can_prepack(torch.bfloat16)
        else f"oneDNN cannot prepack bf16 here: {cap.reason}",
    }
    for item in items:
        for name, reason in missing.items():
            if reason and item.get_closest_marker(name):
                item.add_marker(pytest.mark.skip(reason=reason))
