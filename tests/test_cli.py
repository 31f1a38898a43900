"""A newcomer's walk through ``envace``: every command is listed, and bad input is one or two lines.

The CLI runs in-process (``envace.cli.main``) on the tiny ``configs/smoke.yaml`` model; nothing is
built: every bad input stops before instantiation, and the working folder stays empty.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import jsonargparse
import pytest

from envace.cli import COMMANDS, main
from envace.commands.errors import condense
from envace.commands.preflight import check_model_source

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
EVERY_COMMAND = ("fit", "validate", "data", "show", "evaluate", "bench", "experiment", "export", "serve-env")


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder (the configs' relative ``runs/`` would land here), an empty
    Hugging Face cache, and no network for the hub."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return folder


def bad_input(capsys: pytest.CaptureFixture[str], work: Path, *args: str) -> str:
    """Run ``envace *args``; it must exit 2 with at most two lines on stderr and leave nothing behind."""
    rc = main(list(args))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert 1 <= len(err.strip().splitlines()) <= 2, err
    assert "Traceback" not in err
    assert list(work.iterdir()) == [], "a bad input left files behind"
    assert argparse.ArgumentParser.error.__name__ == "error"  # the parsers are as they were
    assert jsonargparse.ArgumentParser.error.__name__ == "error"
    return err


# --- the list of commands ----------------------------------------------------------------------
def test_help_lists_every_command_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert tuple(COMMANDS) == EVERY_COMMAND
    for name in EVERY_COMMAND:
        assert sum(line.startswith(f"  {name} ") for line in out.splitlines()) == 1, name
    assert "(alias: rehearse)" in out and "--version" in out
    assert "envace fit --model.policy.help" in out and "--model.help EnvACEModule" in out  # hyperparameters
    assert "test" not in out.split() and "predict" not in out.split()


def test_help_into_a_pipe_the_reader_has_closed_is_no_traceback() -> None:
    """``envace --help | head -1`` where head has already gone: exit 0, no BrokenPipeError."""
    code = "import sys, time; from envace.cli import main; time.sleep(0.5); sys.exit(main(['--help']))"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader leaves before the help is written
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_version_is_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"envace {importlib.metadata.version('envace')}"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["evaluat"], "did you mean 'evaluate'?"),
        (["expot", "--ckpt", "x"], "did you mean 'export'?"),
        (["--verison"], "did you mean '--version'?"),
        (["--config", "x.yaml", "fit"], "options of a command go after it"),
        (["test"], "not offered"),
        (["predict"], "not offered"),
    ],
)
def test_unknown_commands_name_the_nearest(
    args: list[str], expected: str, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expected in bad_input(capsys, work, *args)


@pytest.mark.parametrize("name", [n for n in EVERY_COMMAND if n not in ("fit", "validate")] + ["rehearse"])
def test_each_command_help_names_the_command(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    shown = "show" if name == "rehearse" else name
    assert capsys.readouterr().out.startswith(f"usage: envace {shown} ")


SUBCOMMANDS = [["experiment", "report"], ["data", "prepare"]]


@pytest.mark.parametrize("command", [[n] for n in EVERY_COMMAND] + SUBCOMMANDS, ids=" ".join)
def test_every_help_comes_from_one_parser_family(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """jsonargparse's help (LightningCLI's parser is one): its own line for ``--help`` (argparse's reads
    "show this help message and exit")."""
    assert re.search(r"-h, --help +Show this help message and exit\.", _help(capsys, *command))


def test_export_bench_and_experiment_keep_their_flags() -> None:
    """Flags without values, choices, defaults and ``--no-report``'s dash, as under argparse."""
    from envace.bench import parse_args
    from envace.commands.export import parser

    args = parser().parse_args(["--ckpt", "a.ckpt", "--out", "folder", "--adapters", "--force"])
    assert (args.ckpt, args.out, args.role, args.adapters, args.force, args.base, args.dtype) == (
        "a.ckpt", "folder", "act", True, True, None, None)  # fmt: skip
    assert not parser().parse_args(["--ckpt", "a", "--out", "b", "--role", "rehearse"]).adapters
    bench = parse_args(["--quick", "--only", "peak, layout", "--threads", "1"])
    assert (bench.quick, bench.sections, bench.threads, bench.engine, bench.model) == (
        True, ["peak", "layout"], 1, "envace", None)  # fmt: skip


def test_experiment_flags_and_report_usage(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--config CONFIG       the experiment config" in _help(capsys, "experiment")
    assert "--no-report           do not write the report at the end (default: False)" in _help(capsys, "experiment")
    assert "--add-fidelity LAYOUT\n" in _help(capsys, "experiment")
    assert "required: results" in bad_input(capsys, work, "experiment", "report")
    assert "did you mean '--no-report'?" in bad_input(capsys, work, "experiment", "--config", "x.yaml", "--no-reprt")


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    assert main([*command, "--help"]) == 0
    return capsys.readouterr().out


def test_fit_help_offers_no_automatic_optimizer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: envace [options] fit ")
    assert "--model.help" in out and "--optimizer" not in out and "--lr_scheduler" not in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model.policy.lora.help"], ["--model.policy.lora.r R", "adapter rank", "model.init_args.policy.lora"]),
        (["--model", "SFTModule", "--model.optim.help"], ["--model.optim.lr LR", "peak learning rate"]),
        (["--config", SMOKE, "--model.limits.help"], ["--model.limits.max_new_tokens"]),
        (["--model.responder.help"], ["subclasses: ", "RealEnvironment"]),
    ],
)
def test_every_nested_group_has_a_help(
    args: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fit", *args]) == 0
    out = capsys.readouterr().out
    assert all(text in out for text in expected), out


# --- bad input: one or two lines, exit status 2, nothing left behind ------------------------------
def _typo_config(folder: Path, old: str, new: str) -> str:
    path = folder / "typo.yaml"
    text = Path(SMOKE).read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return str(path)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("  max_steps: 4", "  max_stepz: 4", "unknown key 'trainer.max_stepz'; did you mean 'trainer.max_steps'?"),
        ("    group_size: 2", "    group_sise: 2", "did you mean 'model.group_size'?"),
        ("      name_or_path: tiny", "      name_or_pth: tiny", "did you mean 'model.policy.name_or_path'?"),
        ("trainer:", "trainr:", "did you mean 'trainer."),
    ],
)
def test_a_config_key_typo_names_the_key(
    old: str, new: str, expected: str, work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _typo_config(tmp_path, old, new)
    assert expected in bad_input(capsys, work, "fit", "--config", config)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--data.task_per_step", "3"], "did you mean '--data.tasks_per_step'?"),
        (["--trainer.max_step", "3"], "did you mean '--trainer.max_steps'?"),  # no silent abbreviation
        (["--model.init_args.policy.lora.rr", "3"], "did you mean 'model.policy.lora.r'?"),
        (["--optimizer", "SGD"], "--model.optim"),
        (["--ckpt_path", "/nonexistent.ckpt"], "--ckpt_path /nonexistent.ckpt: no such file"),
        (["--model.policy.name_or_path", "smollm2-135"], "HF_HUB_OFFLINE is set; did you mean 'smollm2-135m'?"),
        (["--model.policy.checkpoint", "/nonexistent.ckpt"], "model.policy.checkpoint /nonexistent.ckpt"),
    ],
)
def test_a_bad_fit_option_is_one_line(
    extra: list[str], expected: str, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert expected in bad_input(capsys, work, "fit", "--config", SMOKE, *extra)


def test_a_missing_config_file(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "/nonexistent.yaml" in bad_input(capsys, work, "validate", "--config", "/nonexistent.yaml")
    assert "needs a config" in bad_input(capsys, work, "fit")


@pytest.mark.parametrize(("logger", "package"), [("WandbLogger", "wandb"), ("MLFlowLogger", "mlflow")])
def test_a_logger_without_its_package_names_the_extra(
    logger: str, package: str, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed: the logger would run")
    err = bad_input(capsys, work, "fit", "--config", SMOKE, "--trainer.logger", logger)
    assert f"pip install 'envace[{package}]'" in err


def test_an_unreachable_hub_is_told_apart_fast(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    err = bad_input(capsys, work, "fit", "--config", SMOKE, "--model.policy.name_or_path", "org/no-such-model")
    assert "cannot be reached: offline?" in err and "local names: smollm2-135m, tiny" in err


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("smollm2-135", "did you mean 'smollm2-135m'?"), ("./no-such-folder", "no such folder"),
     ("/no/such.ckpt", "no such checkpoint file"), ("orcale", "did you mean 'oracle'?")],
)  # fmt: skip
def test_evaluate_refuses_an_unknown_policy_before_loading(
    policy: str, expected: str, work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = bad_input(capsys, work, "evaluate", "--policy", policy, "--out", "eval-out")
    assert expected in err, err


def test_show_refuses_an_unknown_policy_before_loading(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean 'smollm2-135m'?" in bad_input(capsys, work, "show", "--policy", "smollm2-135")
    assert "--checkpoint /no/such.ckpt: no such checkpoint file" in bad_input(
        capsys, work, "show", "--checkpoint", "/no/such.ckpt"
    )


def test_other_commands_suggest_the_nearest_option(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean '--force'?" in bad_input(capsys, work, "export", "--ckpt", "x", "--out", "y", "--forse")
    assert "did you mean 'prepare'?" in bad_input(capsys, work, "data", "prepre")
    assert "did you mean '--quick'?" in bad_input(capsys, work, "bench", "--quik")


def test_a_bad_input_through_the_console_script(tmp_path: Path) -> None:
    """The real process: its whole stderr (logging included) is two lines at most, exit status 2."""
    cmd = [sys.executable, "-m", "envace.cli", "fit", "--config", SMOKE, "--ckpt_path", "missing.ckpt"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "envace fit: error: --ckpt_path missing.ckpt: no such file; give a Lightning .ckpt, or 'last' to resume the run"
    ]
    assert list(tmp_path.iterdir()) == []


# --- the pieces ----------------------------------------------------------------------------------
def test_a_nested_union_report_condenses_to_its_key() -> None:
    """jsonargparse's report of an unknown key two classes deep (20 lines) as one line."""
    message = """Parser key "model":
  Does not validate against any of the Union subtypes
  Subtypes: [<class 'envace.modules.base.PolicyModule'>, <class 'NoneType'>]
  Errors:
    - Problem with given class_path 'envace.modules.EnvACEModule':
        Parser key "limits":
          Does not validate against any of the Union subtypes
          Errors:
            - Problem with given class_path 'envace.rollout.RolloutLimits':
                Option 'max_new_token' is not accepted
            - Expected a <class 'NoneType'>
          Given value type: <class 'dict'>
    - Expected a <class 'NoneType'>
  Given value type: <class 'dict'>"""
    assert (
        condense(message, []) == "unknown key 'model.limits.max_new_token'; did you mean 'model.limits.max_new_tokens'?"
    )
    assert condense("Parser key \"model.group_size\": Expected a <class 'int'>. Got value: many", []) == (
        "model.group_size: Expected a <class 'int'>. Got value: many"
    )


def test_model_sources_that_exist_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = tmp_path / "hf" / "models--org--cached" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    ckpt = tmp_path / "a.ckpt"
    ckpt.write_bytes(b"")
    for name in ("smollm2-135m", "tiny", str(tmp_path), "org/cached", str(ckpt)):
        check_model_source(name, "--policy")  # no error
