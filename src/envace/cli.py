"""``envace``: one entry point for every command; ``envace --help`` lists them, one line each.

``fit`` and ``validate`` are LightningCLI's (the modules have no ``test_step`` or ``predict_step``,
so ``test`` and ``predict`` are not offered; the optimizer is the module's ``optim``, so neither are
LightningCLI's ``--optimizer`` and ``--lr_scheduler``); the other commands are a module's
``main(argv)`` (:data:`COMMANDS`). A bad command line, a missing file or an unknown model name is
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
from typing import Any

from envace.commands.errors import UsageError, did_you_mean, usage_errors

#: every command: its ``module:function`` (``None``: LightningCLI) and its line in ``envace --help``
COMMANDS: dict[str, tuple[str | None, str]] = {
    "fit": (None, "train a policy (LightningCLI): grounded warm start, then role-wise GRPO"),
    "validate": (None, "one validation pass of a policy: rehearsal fidelity and task success"),
    "data": ("envace.data.prepare:data_main", "prepare a task source (data prepare) or replay its gold (data verify)"),
    "show": ("envace.commands.show:main", "one task acted and rehearsed beside the real environment"),
    "evaluate": ("envace.commands.preflight:evaluate", "a policy on a benchmark, with test-time private rehearsal"),
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


def _policy_name(policy: Any) -> str:
    """The name_or_path of a parsed policy spec (a dataclass or, before instantiation, a namespace)."""
    if policy is None:
        return "smollm2-135m"
    policy = getattr(policy, "init_args", policy)
    return str(getattr(policy, "name_or_path", "smollm2-135m"))


def trainer_class() -> type:
    """Lightning's ``Trainer`` whose ``precision`` also takes ``auto`` (:mod:`envace.hardware`)."""
    from lightning.pytorch import Trainer

    from envace import hardware

    class EnvACETrainer(Trainer):
        """``Trainer`` with ``precision: auto``: bf16-mixed where the device computes bf16 natively,
        else 32-true. The choice is printed once; an explicit bf16 on a CPU without it is warned about.

        Args:
            precision: ``auto`` or any Lightning precision (``32-true``, ``bf16-mixed``, ...).
        """

        def __init__(self, *args: Any, precision: str | int | None = "auto", **kwargs: Any) -> None:
            device = _trainer_device(kwargs.get("accelerator", "auto"))
            chosen = hardware.training_precision(precision, device)
            if precision != "auto":
                hardware.warn_if_slow("trainer.precision", str(chosen), device)
            hardware.announce(hardware.describe("trainer.precision", precision, chosen, device))
            super().__init__(*args, precision=chosen, **kwargs)  # type: ignore[arg-type]

    return EnvACETrainer


def _trainer_device(accelerator: Any) -> str:
    """``cuda`` when the trainer will run on a CUDA device, else ``cpu``."""
    import torch

    name = accelerator if isinstance(accelerator, str) else type(accelerator).__name__
    if name.lower().startswith("cpu"):
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def lightning_cli(args: list[str] | None = None, run: bool = True) -> Any:
    """The LightningCLI of ``envace fit | validate`` (``run=False``: parse and instantiate only)."""
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from envace.commands import preflight
    from envace.data.datamodule import EnvACEDataModule
    from envace.modules import PolicyModule

    class EnvACECLI(LightningCLI):
        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            return {name: skip for name, skip in LightningCLI.subcommands().items() if name in ("fit", "validate")}

        def add_arguments_to_parser(self, parser: Any) -> None:
            # the datamodule tokenises with the model's tokenizer
            parser.link_arguments("model.init_args.policy", "data.tokenizer", compute_fn=_policy_name)
            parser.link_arguments("model.init_args.tool_style", "data.tool_style")
            parser.link_arguments("model.init_args.chat_format", "data.chat_format")

        def parse_arguments(self, parser: Any, args: Any) -> None:
            """Parse ``args`` (given on purpose: no warning that sys.argv is set too), then check the files,
            model names and loggers it names, before the seed is set or anything is built."""
            self.config = parser.parse_args(args)
            subcommand = self.config.get("subcommand")
            preflight.check_fit_config(self.config[subcommand] if subcommand else self.config)

        def instantiate_classes(self) -> None:
            try:
                super().instantiate_classes()
            except (ValueError, MisconfigurationException) as exc:  # a config value a class refuses
                raise UsageError(str(exc).strip().splitlines()[0]) from exc

        def before_fit(self) -> None:
            """``--ckpt_path last``: the run's latest last.ckpt across logger versions, or a one-line
            refusal, never Lightning's silent start from step 0 (:mod:`envace.commands.resume`)."""
            from envace.commands.resume import resolve_last

            config = self.config_init[self.subcommand]
            if config.get("ckpt_path") == "last":
                config["ckpt_path"] = resolve_last(self.trainer)

        before_validate = before_fit

    return EnvACECLI(
        PolicyModule,
        EnvACEDataModule,
        subclass_mode_model=True,
        trainer_class=trainer_class(),
        args=args,
        run=run,
        trainer_defaults={"default_root_dir": "runs"},
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False, "prog": "envace", "allow_abbrev": False},
        auto_configure_optimizers=False,
    )


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
