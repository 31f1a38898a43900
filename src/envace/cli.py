"""``envace``: LightningCLI for ``fit | validate | test``, plus the ``data``, ``show``, ``evaluate``,
``bench`` and ``export`` commands.

    envace fit --config configs/bfcl.yaml
    envace fit --config configs/bfcl.yaml --model.policy.name_or_path Qwen/Qwen3-8B
    envace data verify --source bfcl-multi-turn
    envace show --task_id multi_turn_base_0
    envace export --ckpt runs/.../last.ckpt --out exports/policy
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

COMMANDS = {
    "data": "envace.data.prepare:data_main",
    "show": "envace.commands.show:main",
    "evaluate": "envace.evaluation:main",
    "bench": "envace.bench:main",
    "experiment": "envace.experiment:main",
    "export": "envace.commands.export:main",
}
#: former command names that still run their command, after a one-line note
RENAMED = {"rehearse": "show"}


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
    """The LightningCLI of ``envace fit | validate | test`` (``run=False``: parse and instantiate only)."""
    from lightning.pytorch.cli import LightningCLI

    from envace.data.datamodule import EnvACEDataModule
    from envace.modules import PolicyModule

    class EnvACECLI(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            # the datamodule tokenises with the model's tokenizer
            parser.link_arguments("model.init_args.policy", "data.tokenizer", compute_fn=_policy_name)
            parser.link_arguments("model.init_args.tool_style", "data.tool_style")
            parser.link_arguments("model.init_args.chat_format", "data.chat_format")

    return EnvACECLI(
        PolicyModule,
        EnvACEDataModule,
        subclass_mode_model=True,
        trainer_class=trainer_class(),
        args=args,
        run=run,
        trainer_defaults={"default_root_dir": "runs"},
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"default_env": False},
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``envace`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args and args[0] in RENAMED:  # "rehearse" is the role that writes tool responses, not a viewer
        print(f"envace {args[0]}: renamed to `envace {RENAMED[args[0]]}`; running that", file=sys.stderr)
        args[0] = RENAMED[args[0]]
    if args and args[0] in COMMANDS:
        module, fn = COMMANDS[args[0]].split(":")
        try:
            rc = getattr(importlib.import_module(module), fn)(args[1:])
        except (ValueError, FileNotFoundError) as exc:  # bad input: a clear message, not a traceback
            print(f"envace {args[0]}: error: {exc}", file=sys.stderr)
            return 2
        return int(rc or 0)
    lightning_cli(argv)  # None: LightningCLI reads sys.argv itself
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
