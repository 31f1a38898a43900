"""The tasks an experiment trains and evaluates on, counted: the figures docs/training.md and
docs/data.md quote about the training pools and the held-out set.

    python studies/bfcl_arms/task_pools.py studies/bfcl_arms/bfcl_cpu_v2.yaml
    python studies/bfcl_arms/task_pools.py studies/recipe_search/bfcl_cpu_tune3.yaml

Training (the base config's data with the experiment's fit arguments, read as ``envace fit`` reads
them): the tasks kept, their families (a BFCL scenario with its categories), RL's share of them and
the warm start's, and the grounded episodes that fit; how often the warm start sees each episode in
its steps. Held-out (``evaluation``): per split, the first turns whose prompt fits and their
families, then those the cap chose. Loads the tokenizer and grounds the training tasks (seconds); trains nothing.
"""

from __future__ import annotations

import sys


def main(path: str) -> None:
    from envace.commands.fit_config import load_fit_config
    from envace.data.datamodule import EnvACEDataModule
    from envace.data.pools import family_of
    from envace.experiment import load_config
    from envace.experiment.evaluate import held_out

    cfg = load_config(path)
    dm = EnvACEDataModule(**load_fit_config(["--config", cfg.base, *cfg.fit_args]).data.as_dict())
    dm.setup()

    def families(tasks: list) -> int:
        return len({family_of(t.id) for t in tasks})

    grounded = dm.counts["grounded"] + dm.counts["recorded"]
    steps, per_step = cfg.warm_start_steps, dm.sft_batch_size
    print(f"{cfg.name}: training tasks {dm.counts['train_tasks']}; RL rolls out {len(dm.train_set)} "
          f"({families(dm.train_set)} families; rl_share {dm.rl_share}); the warm start grounds {grounded}, "
          f"{len(dm.episodes)} episodes fit max_sft_tokens, each seen {steps * per_step / len(dm.episodes):.1f} "
          f"times in its {steps} steps of {per_step}")  # fmt: skip
    tokenizer, fmt = dm.encoder.tokenizer, dm.fmt
    uncapped = type(cfg.evaluation)(**{**cfg.evaluation.__dict__, "tasks_per_split": None})
    for split in cfg.evaluation.splits:
        fit, chosen = held_out(uncapped, split, tokenizer, fmt), held_out(cfg.evaluation, split, tokenizer, fmt)
        print(f"held-out {split}: {len(fit)} first turns fit ({families(fit)} families); chosen {len(chosen)} "
              f"({families(chosen)} families)")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python studies/bfcl_arms/task_pools.py <experiment config>")
    main(sys.argv[1])
