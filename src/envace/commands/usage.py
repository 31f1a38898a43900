"""What ``envace --help`` prints, and the help of every nested group of the module's hyperparameters.

jsonargparse lists a module's arguments with ``envace fit --model.help EnvACEModule``, and names
``--model.policy.help`` there, but a group below the module (``policy``, ``policy.lora``, ``limits``,
``sampling``, ...) is a value of the ``--model`` option, so jsonargparse cannot reach its help from
the command line. :func:`nested_help` answers ``envace fit --model.<group>[.<group>...].help``: the
group's arguments, each with its docstring, type and default, spelled as the command line takes them.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from envace.commands.errors import UsageError, import_class, init_parameters, unknown_key

#: an option asking the help of a group below the module: --model[.init_args].<a>[.<b>...].help
NESTED_HELP = re.compile(r"^--model(?:\.init_args)?((?:\.\w+)+)\.help$")

HYPERPARAMETERS = """\
hyperparameters (every one documented where it is declared):
  envace fit --help                              trainer, data, --ckpt_path and the --model option
  envace fit --model.help EnvACEModule           the module's arguments (SFTModule: the warm start alone)
  envace fit --model.policy.help                 a group's arguments: policy, policy.lora, optim, limits,
                                                 sampling, loss, simulator, judge (--model SFTModule
                                                 or --config first, for that module's groups)
  envace fit --config configs/smoke.yaml --print_config    every value of a config, as YAML"""


def overview(commands: dict[str, str], aliases: dict[str, str], version: str) -> str:
    """The text of ``envace --help``: one line per command, then how to reach every hyperparameter."""
    width = max(map(len, commands)) + 2
    alias_of = {target: name for name, target in aliases.items()}
    lines = [
        "usage: envace <command> [options]       (envace <command> --help: its options)",
        "",
        f"EnvACE {version}: world rehearsal for tool-using LLM agents; one policy acts and plays the",
        "environment, trained with role-wise GRPO in Lightning.",
        "",
        "commands:",
    ]
    for name, summary in commands.items():
        alias = f" (alias: {alias_of[name]})" if name in alias_of else ""
        lines.append(f"  {name.ljust(width)}{summary}{alias}")
    lines += ["", "options:", "  -h, --help    this list", "  --version     the installed version", ""]
    return "\n".join([*lines, HYPERPARAMETERS])


def command_parser(prog: str, description: str) -> Any:
    """The jsonargparse parser of a command built from ``add_argument`` calls (flags without values,
    choices): its ``--help`` keeps the description's lines (a module docstring) and shows every
    option's type and default, as the other commands' do."""
    import argparse

    from jsonargparse import ArgumentParser, DefaultHelpFormatter

    class Layout(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
        """jsonargparse's help, the description as written."""

    return ArgumentParser(prog=prog, description=description, formatter_class=Layout, default_env=False)


def module_class(args: list[str]) -> type:
    """The LightningModule a fit command line (a help request taken out) trains, as ``envace fit``
    resolves it from its ``--config`` files, ``--model`` and overrides; ``EnvACEModule`` when they name
    none (:data:`envace.commands.fit_config.STAND_INS`)."""
    from envace.commands.fit_config import load_fit_config

    found = import_class(load_fit_config(args, partial=True).model.class_path)
    assert found is not None, "the parser takes the class path of a PolicyModule only"
    return found


def group_class(hint: Any) -> type | None:
    """The class a parameter's type hint takes (``PolicySpec`` of ``PolicySpec | None``), or ``None``
    for a plain value (a number, a string, a list)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    for arg in typing.get_args(hint) if union else (hint,):
        if isinstance(arg, type) and arg.__module__ not in ("builtins", "typing"):
            return arg
    return None


def _subclass(base: type, name: str) -> type | None:
    """The subclass of ``base`` (itself included) named ``name`` or by its dotted path."""
    for cls in [base, *_all_subclasses(base)]:
        if name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}") or name.endswith("." + cls.__name__):
            return cls
    return None


def resolve_group(module: type, path: list[str]) -> type:
    """The class of the group ``model.<path>`` of ``module``."""
    cls: type = module
    for depth, part in enumerate(path):
        params = init_parameters(cls)
        here = ["model", *path[:depth]]
        if part not in params:
            known = [".".join([*here, p, "help"]) for p in params]
            raise UsageError(unknown_key(".".join([*here, part, "help"]), known, dashes="--"),
                             hint=f"`envace fit --{'.'.join(here)}.help` lists them")  # fmt: skip
        found = group_class(params[part])
        if found is None:
            raise UsageError(f"--{'.'.join([*here, part])} is a value, not a group: "
                             f"`envace fit --{'.'.join(here)}.help` describes it")  # fmt: skip
        cls = found
    return cls


def nested_help(subcommand: str, args: list[str]) -> str | None:
    """The help ``args`` ask with ``--model.<group>.help [CLASS]``, or ``None`` when they ask none."""
    asked = next(((i, m) for i, a in enumerate(args) if (m := NESTED_HELP.match(a))), None)
    if asked is None:
        return None
    index, match = asked
    path = match.group(1).strip(".").split(".")
    choice = args[index + 1] if index + 1 < len(args) and not args[index + 1].startswith("-") else None
    cls = resolve_group(module_class(args[:index] + args[index + 1 + (choice is not None) :]), path)
    if choice is not None:
        chosen = _subclass(cls, choice)
        if chosen is None:
            raise UsageError(f"--model.{'.'.join(path)}.help {choice}: not a {cls.__name__}")
        cls = chosen
    from jsonargparse import ArgumentParser

    key = "model." + ".".join(path)
    parser = ArgumentParser(prog=f"envace {subcommand}", default_env=False, exit_on_error=False, add_help=False)
    parser.add_class_arguments(cls, nested_key=key, fail_untyped=False)
    head = [f"{cls.__module__}.{cls.__qualname__}: in a config, under model.init_args.{'.'.join(path)}"]
    subclasses = sorted({c.__name__ for c in _all_subclasses(cls)})
    if subclasses:
        head.append(f"subclasses: {', '.join(subclasses)} (--{key}.help NAME: the arguments of one)")
    if not init_parameters(cls):
        head.append("(no arguments)")
    return "\n".join([*head, "", parser.format_help()])


def _all_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    subclasses: list[type] = type.__subclasses__(cls)
    for sub in subclasses:
        found += [sub, *_all_subclasses(sub)]
    return found
