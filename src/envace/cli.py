"""``envace``: one entry point for every command; ``envace --help`` lists them, one line each.

``fit`` and ``validate`` are LightningCLI's (the modules have no ``test_step`` or ``predict_step``,
so ``test`` and ``predict`` are not offered; the optimizer is the module's ``optim``, so neither are
LightningCLI's ``--optimizer`` and ``--lr_scheduler``); the other commands are a module's
``main(argv)`` (:data:`COMMANDS`). The LightningCLI, and the one loader every command reads a fit
config with, are :mod:`envace.commands.fit_config`. A bad command line, a missing file or an unknown model name is
one or two lines on stderr and exit status 2, found before anything is built
(:mod:`envace.commands.errors`, :mod:`envace.commands.preflight`).

    envace fit --config configs/bfcl.yaml
    envace fit --config configs/bfcl.yaml --model.policy.name_or_path Qwen/Qwen3-8B
    envace fit --model.policy.lora.help                 # every hyperparameter has a --help
    envace data verify --source bfcl-multi-turn
    envace show --task_id multi_turn_base_0
    envace export --ckpt runs/.../last.ckpt --out exports/policy
"""

from __future__ import annotations

import importlib
import os
import sys

from envace.commands.errors import UsageError, did_you_mean, usage_errors
from envace.commands.fit_config import lightning_cli

#: every command: its ``module:function`` (``None``: LightningCLI) and its line in ``envace --help``
COMMANDS: dict[str, tuple[str | None, str]] = {
    "fit": (None, "train a policy (LightningCLI): grounded warm start, then role-wise GRPO"),
    "validate": (None, "one validation pass of a policy: rehearsal fidelity and task success"),
    "data": ("envace.data.prepare:data_main", "prepare a task source (data prepare) or replay its gold (data verify)"),
    "show": ("envace.commands.show:main", "one task acted and rehearsed beside the real environment"),
    "evaluate": ("envace.commands.evaluate:main", "a policy on a benchmark, with test-time private rehearsal"),
    "bench": ("envace.bench:main", "speed and memory of training and rollout on this machine (JSON)"),
    "experiment": ("envace.experiment:main", "the arms x seeds comparison grid, resumable, and its report"),
    "export": ("envace.commands.export:main", "a checkpoint's act or rehearse weights as a save_pretrained folder"),
    "serve-env": ("envace.commands.serve_env:main", "a trained policy's rehearse role served as an MCP server"),
}
#: former names of a command, which still run it after a one-line note
ALIASES = {"rehearse": "show"}
#: LightningCLI's subcommands it does not offer, and why
NOT_OFFERED = {
    "test": "the modules have no test_step: use `envace validate`, or `envace evaluate` on held-out tasks",
    "predict": "the modules have no predict_step: use `envace show` or `envace evaluate`",
}


def version() -> str:
    """The installed package's version (``pyproject.toml``'s ``[project] version``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("envace")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _lightning(args: list[str]) -> int:
    """``envace fit | validate``: a nested group's help (``--model.policy.help``), or LightningCLI."""
    from envace.commands.usage import nested_help

    automatic = next((a.split("=")[0] for a in args if a.split("=")[0] in ("--optimizer", "--lr_scheduler")), None)
    if automatic is not None:  # LightningCLI's own, not offered: the module builds its optimizer
        what = f"unknown option {automatic!r}: the optimizer and its schedule are the module's optim (--model.optim.lr)"
        raise UsageError(what, hint="`envace fit --model.optim.help` lists its arguments")
    if len(args) == 1:
        command = f"envace {args[0]}"
        raise UsageError(f"`{command}` needs a config, e.g. {command} --config configs/smoke.yaml",
                         hint=f"`{command} --help` lists the options; configs/ holds the shipped ones")  # fmt: skip
    text = nested_help(args[0], args[1:])
    if text is not None:
        print(text)
        return 0
    lightning_cli(args)
    return 0


def _run(name: str, args: list[str]) -> int:
    """Run the command ``name`` with the arguments after it."""
    target = COMMANDS[name][0]
    with usage_errors():
        if target is None:
            return _lightning([name, *args])
        module, fn = target.split(":")
        try:
            return int(getattr(importlib.import_module(module), fn)(args) or 0)
        except UsageError:
            raise
        except (ValueError, FileNotFoundError) as exc:  # bad input: a clear message, not a traceback
            raise UsageError(str(exc)) from exc


def _command(word: str) -> str:
    """The command ``word`` names, or a :class:`UsageError` naming the nearest one."""
    name = ALIASES.get(word, word)
    if word in ALIASES:  # "rehearse" is the role that writes tool responses; the command only shows a task
        print(f"envace {word}: renamed to `envace {name}`; running that", file=sys.stderr)
    if name in COMMANDS:
        return name
    hint = "`envace --help` lists the commands"
    if word in NOT_OFFERED:
        raise UsageError(f"`envace {word}` is not offered: {NOT_OFFERED[word]}", hint=hint)
    if word.startswith("-"):
        options = ["--help", "--version"]
        where = f"; options of a command go after it: envace fit {word} ..." if word not in options else ""
        raise UsageError(f"unknown option {word!r}{did_you_mean(word, options) or where}", hint=hint)
    raise UsageError(f"unknown command {word!r}{did_you_mean(word, [*COMMANDS, *ALIASES])}", hint=hint)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``envace`` console script; returns the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:  # `envace --help | head`: the reader has gone, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second one at exit's flush
        return 0


def _main(argv: list[str] | None) -> int:
    from envace.commands.usage import overview

    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "" not in sys.path and os.getcwd() not in sys.path:  # the user's modules import as under `python -m`
        sys.path.append(os.getcwd())  # last: a folder here never shadows an installed package
    if not args or args[0] in ("-h", "--help"):
        print(overview({n: line for n, (_, line) in COMMANDS.items()}, ALIASES, version()))
        return 0
    if args[0] == "--version":
        print(f"envace {version()}")
        return 0
    prog = "envace"
    try:
        name = _command(args[0])
        prog = f"envace {args[0]}"
        return _run(name, args[1:])
    except UsageError as exc:
        print(exc.lines(prog), file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and --print_config end the parse with exit status 0
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        raise


if __name__ == "__main__":
    raise SystemExit(main())
