"""Every config parses through the CLI (STYLE.md row 10), and `envace fit --print_config` works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS = ("eval", "fsdp", "arms", "experiments")  # not fit configs: eval, overlays (tested composed), grids
FIT_CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if not set(OVERLAYS) & set(p.parts))
ARMS = sorted(p.stem for p in (ROOT / "configs" / "arms").glob("*.yaml"))


def _envace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envace.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.parametrize("config", FIT_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_fit_config_parses(config: Path) -> None:
    text = config.read_text()
    assert text.startswith("#"), "every config opens with a comment: its purpose and launch command"
    assert "envace " in text.split("\n\n")[0], "the header names the launch command"
    out = _envace("fit", "--config", str(config), "--print_config")
    assert out.returncode == 0, out.stderr[-3000:]
    printed = yaml.safe_load(out.stdout)
    assert printed["model"]["class_path"].startswith("envace.modules.")


def test_linked_values_reach_the_datamodule() -> None:
    from envace.cli import lightning_cli

    cli = lightning_cli(
        ["--config", str(ROOT / "configs/smoke.yaml"), "--model.init_args.tool_style", "json"], run=False
    )
    assert cli.datamodule.tokenizer_name == cli.model.policy_spec.name_or_path == "tiny"
    assert cli.datamodule.tool_style == "json" and cli.model.fmt.tool_style == "json"


def test_fsdp_config_composes_with_a_base_config() -> None:
    out = _envace("fit", "--config", "configs/bfcl.yaml", "--config", "configs/fsdp/8gpu.yaml", "--print_config")
    assert out.returncode == 0, out.stderr[-3000:]
    printed = yaml.safe_load(out.stdout)
    assert printed["trainer"]["strategy"]["class_path"].endswith("ModelParallelStrategy")
    assert printed["model"]["init_args"]["group_size"] == 4


def test_bad_config_value_is_a_clear_error() -> None:
    out = _envace("fit", "--config", "configs/smoke.yaml", "--model.init_args.group_size", "many", "--print_config")
    assert out.returncode != 0 and "group_size" in out.stderr


@pytest.mark.parametrize("base", ["bfcl", "tau2", "mcp_example"])
@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_composes_with_a_base_config(base: str, arm: str) -> None:
    """Each arm overlay (configs/arms/) on the BFCL and tau2 configs: the arm's setting and nothing
    else changes (the same data, limits, sampling and steps), and its run writes to its own folder."""
    from envace.cli import lightning_cli
    from envace.modules.simulator import SimulatorSpec
    from envace.rollout import PolicyRehearsal, RealEnvironment

    text = (ROOT / "configs" / "arms" / f"{arm}.yaml").read_text()
    assert text.startswith("#") and f"configs/arms/{arm}.yaml" in text.split("\n\n")[0]
    plain = lightning_cli(["--config", f"configs/{base}.yaml"], run=False)
    cli = lightning_cli(["--config", f"configs/{base}.yaml", "--config", f"configs/arms/{arm}.yaml"], run=False)
    model, ref = cli.model, plain.model
    assert cli.trainer.logger.version == arm and cli.trainer.max_steps == plain.trainer.max_steps
    assert (model.limits, model.sampling, model.warm_start_steps) == (ref.limits, ref.sampling, ref.warm_start_steps)
    weights = model.loss.role_weights
    expected = {
        "envace": (PolicyRehearsal, None, False, {"act": 1.0, "rehearse": 1.0}),
        "real_env": (RealEnvironment, None, False, weights),
        "simulator": (PolicyRehearsal, SimulatorSpec("warm_start", trainable=False), False, weights),
        "separate": (PolicyRehearsal, SimulatorSpec("policy", trainable=True), False, weights),
        "sft_only": (PolicyRehearsal, None, True, weights),
        "act_loss_only": (PolicyRehearsal, None, False, {"act": 1.0, "rehearse": 0.0}),
        "rehearse_loss_only": (PolicyRehearsal, None, False, {"act": 0.0, "rehearse": 1.0}),
    }[arm]
    assert (type(model.responder), model.simulator_spec, model.warm_start_only, dict(weights)) == expected
