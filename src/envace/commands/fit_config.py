"""The fit config: ``envace fit | validate``'s LightningCLI, and the one loader every command reads a
fit config with.

:func:`lightning_cli` builds the CLI (its trainer taking ``precision: auto``, the datamodule's
tokenizer, tool style and chat format linked to the model's). :func:`load_fit_config` parses a fit
command line with that CLI's own parser and stops there: ``--config`` files and their overlays in
order, dotted overrides, the classes' defaults, ``class_path``/``init_args`` and the links resolve as
``envace fit`` resolves them, but nothing is instantiated (no tokenizer, no weights, no trainer) and
the global random state is left as it was. ``serve-env``, ``envace fit --model.<group>.help`` and an
experiment's units read their fit config through it, never as raw YAML (which misses overlays,
overrides and defaults).

    config = load_fit_config(["--config", "configs/bfcl.yaml", "--config", "configs/arms/real_env.yaml"])
    config.model.class_path, config.model.init_args.limits.max_new_tokens, config.data.sources
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envace.commands.errors import UsageError, condense, option_strings

if TYPE_CHECKING:
    from envace.data.sources import SourceSpec

#: what a partial fit config stands in for the values ``envace fit`` requires: the module that
#: ``envace fit --model.help`` describes, and no data source
STAND_INS = ("--model", "EnvACEModule", "--data.sources", "[]")


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


def _cli_class() -> type:
    """The LightningCLI subclass of ``envace fit | validate`` (built here: Lightning imports late)."""
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from envace.commands import preflight

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

    return EnvACECLI


def _build(cls: type, args: list[str] | None, run: bool, parser: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """An instance of the CLI class ``cls`` (:func:`_cli_class` or a subclass) on ``args``; ``parser``:
    more arguments of its parser."""
    from envace.data.datamodule import EnvACEDataModule
    from envace.modules import PolicyModule

    return cls(
        PolicyModule,
        EnvACEDataModule,
        subclass_mode_model=True,
        trainer_class=trainer_class(),
        args=args,
        run=run,
        trainer_defaults={"default_root_dir": "runs"},
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False, "prog": "envace", "allow_abbrev": False, **(parser or {})},
        auto_configure_optimizers=False,
        **kwargs,
    )


def lightning_cli(args: list[str] | None = None, run: bool = True) -> Any:
    """The LightningCLI of ``envace fit | validate`` (``run=False``: parse and instantiate only)."""
    return _build(_cli_class(), args, run)


def load_fit_config(args: list[str], partial: bool = False) -> Any:
    """The fit config that ``envace fit ARGS`` would run (``ARGS`` without the subcommand and without
    ``--ckpt_path``), parsed and not instantiated: a jsonargparse ``Namespace`` with ``trainer``,
    ``model`` (``class_path``, ``init_args``), ``data`` and ``seed_everything``, every default filled in.

    Only parsing: the preflight checks of ``envace fit`` (files, model names, loggers) are not run, no
    class is built and the random state is not seeded. A command line the parser refuses is a one-line
    :class:`~envace.types.UsageError` naming the key.

    Args:
        args: ``--config`` files (each overlaying the ones before), dotted overrides, ``--model NAME``.
        partial: a part of a fit config is enough (for a command that reads only some keys): what
            ``envace fit`` requires and ``args`` do not give is :data:`STAND_INS`.
    """
    from jsonargparse import ArgumentError

    class ParseOnly(_cli_class()):  # type: ignore[misc]
        def parse_arguments(self, parser: Any, args: Any) -> None:
            try:
                self.config = parser.parse_args(args)
            except ArgumentError as exc:
                raise UsageError(condense(str(exc), option_strings(parser))) from None

        def _set_seed(self) -> None:
            """Not seeded: LightningCLI seeds the global random state before it instantiates."""

        def instantiate_classes(self) -> None:
            """Nothing built."""

    quiet = {"exit_on_error": False}  # a refusal raises, and is told in one line above
    args = [*STAND_INS, *args] if partial else list(args)
    return _build(ParseOnly, args, False, parser=quiet, load_from_checkpoint_support=False).config


def fit_source(config: str | None) -> SourceSpec:
    """The first training source of the fit config ``config``, as ``envace fit`` reads it: your own
    tasks for ``envace evaluate --benchmark tasks`` (which picks their split). One-line errors."""
    from envace.data.sources import SourceSpec

    if not config:
        raise UsageError("tasks: pass --tasks.path <the fit config whose data.sources names your tasks>")
    try:
        sources = load_fit_config(["--config", config], partial=True).data.sources or []
    except UsageError as exc:
        raise UsageError(f"tasks: --tasks.path {config}: {exc}") from None
    if not sources:
        raise UsageError(f"tasks: --tasks.path {config}: no data.sources (is it the fit config?)")
    return SourceSpec.parse(sources[0])
