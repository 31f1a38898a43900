"""The one loader of a fit config (:func:`envace.commands.fit_config.load_fit_config`) reads what
``envace fit`` would run, builds nothing and seeds nothing; the nested help finds its module with it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from envace.cli import main
from envace.commands.fit_config import lightning_cli, load_fit_config
from envace.types import UsageError

ROOT = Path(__file__).resolve().parents[2]
BFCL, REAL_ENV = str(ROOT / "configs/bfcl.yaml"), str(ROOT / "configs/arms/real_env.yaml")


def test_overlays_and_overrides_resolve_as_the_fit_resolves_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    args = ["--config", BFCL, "--config", REAL_ENV, "--model.init_args.limits.max_new_tokens", "7"]
    parsed = load_fit_config(args)
    cli = lightning_cli(args, run=False)
    model = parsed.model.init_args
    assert parsed.model.class_path == "envace.modules.EnvACEModule"
    assert model.responder.class_path == "envace.rollout.RealEnvironment"  # the overlay's
    assert model.limits.as_dict() == dataclasses.asdict(cli.model.limits) and model.limits.max_new_tokens == 7
    assert model.sampling.as_dict() == dataclasses.asdict(cli.model.sampling)  # every default filled in
    assert parsed.trainer.logger.init_args.version == "real_env" == cli.trainer.logger.version
    assert parsed.data.tokenizer == cli.datamodule.tokenizer_name  # the links run at the parse


def test_nothing_is_built_and_the_random_state_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import envace.modules.base

    def no_tokenizer(*args: object) -> None:
        raise AssertionError("a tokenizer was loaded")

    monkeypatch.setattr(envace.modules.base, "load_tokenizer", no_tokenizer)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    parsed = load_fit_config(["--config", str(ROOT / "configs/smoke.yaml")])  # it says seed_everything: 0
    assert torch.equal(torch.rand(3), expected) and parsed.seed_everything == 0


def test_a_refused_command_line_is_one_line_naming_the_key() -> None:
    with pytest.raises(UsageError, match=r"^unknown key 'model.limits.max_new_tokns'; did you mean") as refused:
        load_fit_config(["--config", BFCL, "--model.init_args.limits.max_new_tokns", "7"])
    assert "\n" not in str(refused.value)
    with pytest.raises(UsageError, match="required: model"):
        load_fit_config(["--data.sources", "[{name: tasks}]"])


def test_a_partial_config_gets_the_stand_ins() -> None:
    parsed = load_fit_config(["--model.init_args.tool_style", "json"], partial=True)
    assert (parsed.model.class_path, parsed.data.sources, parsed.model.init_args.tool_style) == (
        "envace.modules.EnvACEModule", [], "json")  # fmt: skip
    assert load_fit_config(["--model", "SFTModule"], partial=True).model.class_path == "envace.modules.SFTModule"


@pytest.mark.parametrize(
    ("choose", "refused"),
    [(["--model.class_path", "SFTModule"], True), (["--config", "{sft}"], True), (["--config", "{sft}",
     "--model", "EnvACEModule"], False)],
)  # fmt: skip
def test_the_nested_help_is_of_the_module_the_command_line_trains(
    choose: list[str], refused: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``SFTModule`` has no responder: its help is refused, however the module was chosen (a dotted
    class_path, a config naming the class alone), and given when a later ``--model`` chooses again."""
    sft = tmp_path / "sft.yaml"
    sft.write_text("model: SFTModule\n")
    rc = main(["fit", *[a.format(sft=sft) for a in choose], "--model.responder.help"])
    out = capsys.readouterr()
    if refused:
        assert rc == 2 and "unknown option '--model.responder.help'" in out.err
    else:
        assert rc == 0 and "subclasses: " in out.out and "RealEnvironment" in out.out


def test_the_nested_help_of_no_module_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--model", "NoSuchModule", "--model.optim.help"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) <= 2 and "model: " in err and "NoSuchModule" in err
