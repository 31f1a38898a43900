"""An experiment reads its fit configs as ``envace fit`` does (:mod:`envace.commands.fit_config`): the
base config with the grid's ``fit_args`` (overlays and dotted overrides), not the base file alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from envace.experiment import load_config
from envace.experiment.grid import ExperimentConfig, units

ROOT = Path(__file__).resolve().parents[2]


def grid(tmp: Path, fit_args: list[str]) -> ExperimentConfig:
    """One arm, one seed on the smoke config, with ``fit_args``."""
    config = {"name": "reads", "base": str(ROOT / "configs/smoke.yaml"), "arms": ["envace"], "fit_args": fit_args,
              "results": str(tmp / "results"), "work": str(tmp / "work"),
              "evaluation": {"splits": ["val"], "n_values": [0], "modes": ["parallel"]}}  # fmt: skip
    path = tmp / "grid.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_config(str(path))


def test_the_evaluation_runs_with_the_limits_and_tool_style_the_fits_ran_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grid whose ``fit_args`` overlay a config and override a limit: its evaluation takes both (the base
    file alone says tool_style compact and max_new_tokens 16); what neither names is the base's."""
    import envace.evaluation
    import envace.evaluation.policies
    from envace.experiment import evaluate as unit_eval

    overlay = tmp_path / "json.yaml"
    overlay.write_text("model:\n  init_args:\n    tool_style: json\n")
    cfg = grid(tmp_path, ["--config", str(overlay), "--model.init_args.limits.max_new_tokens", "7"])
    used: dict[str, Any] = {}

    def evaluate(benchmark: str, policy: Any, *, limits: Any, model: Any, **kw: Any) -> SimpleNamespace:
        used.update(limits=limits, model=model)
        return SimpleNamespace(items=[])

    monkeypatch.setattr(envace.evaluation, "evaluate", evaluate)
    monkeypatch.setattr(envace.evaluation.policies, "load_eval_policy", lambda *a, **k: SimpleNamespace(
        tokenizer=None, fmt=None))  # fmt: skip
    monkeypatch.setattr(unit_eval, "held_out", lambda *a: [])
    monkeypatch.setattr(unit_eval, "gold_fidelity", lambda *a: [])
    unit_eval.evaluate_unit(cfg, next(u for u in units(cfg) if u.kind == "eval"), tmp_path / "last.ckpt")
    assert used["model"].tool_style == "json" and used["model"].chat_format == "auto"  # the overlay; a default
    assert (used["limits"].max_new_tokens, used["limits"].max_rehearse_tokens) == (7, 16)  # the override; the base


def test_a_fit_arg_overlay_that_pins_the_checkpoint_folder_is_refused_before_the_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every unit would write the same folder: refused in one line, before any fit starts (the base file
    alone has no ``dirpath``, the overlay in ``fit_args`` has)."""
    from envace.experiment import runner

    overlay = tmp_path / "pinned.yaml"
    overlay.write_text("trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
                       "      init_args: {dirpath: ckpt}\n")  # fmt: skip
    cfg = grid(tmp_path, ["--config", str(overlay)])

    def no_fit(*args: Any, **kw: Any) -> None:
        raise AssertionError("a fit started")

    monkeypatch.setattr(runner.subprocess, "run", no_fit)
    for unit in (u for u in units(cfg) if u.kind != "eval"):
        with pytest.raises(ValueError, match=f"{unit.key}: ModelCheckpoint sets dirpath ckpt"):
            runner.run_fit(cfg, unit)
    runner.check_checkpoints(grid(tmp_path, []), units(cfg)[0])  # the smoke config's own callbacks pass
