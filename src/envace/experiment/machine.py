"""The machine a grid's unit computes on: recorded in every result file, and held to the precision
the grid's warm start computed in (``ENVACE_BF16``; docs/experiment.md, "A grid computes in its warm
start's precision")."""

from __future__ import annotations

import json
import os
from typing import Any

from envace.experiment.grid import WARM, ExperimentConfig, is_done, result_path, units


def machine() -> dict[str, Any]:
    """The CPU a unit ran on and the kernels it chose: a grid spans machines, and its units' seconds and
    numerics (bf16 or fp32) are only comparable where these agree."""
    from envace.hardware import capability, cpu_model

    return {"cpu": cpu_model(), **capability().as_dict()}


def pin_numerics(cfg: ExperimentConfig) -> None:
    """Compute in the precision the grid's warm start did (units in bf16 beside units in fp32 would
    differ by their numerics as well as their arm): fp32 by ``ENVACE_BF16=none`` (slower on a bf16 CPU,
    never wrong); a bf16 grid on a CPU without native bf16 (~100x slower) stops, in one line."""
    from envace.hardware import ENV, capability, forced

    warm = next((u for u in units(cfg) if u.kind == WARM), None)
    if warm is None or not is_done(cfg, warm):
        return
    began = (json.loads(result_path(cfg, warm).read_text()).get("machine") or {}).get("cpu_bf16")
    here = capability().cpu_bf16
    if began is None or began == here:
        return
    if began or forced() is not None:
        was, now, fix = ("bf16", "fp32", "native") if began else ("fp32", "bf16", "none")
        raise ValueError(
            f"{cfg.name}: its warm start computed in {was}, this process in {now} ({capability().reason}): run the "
            f"grid's units on a CPU that computes as its warm start did, or set {ENV}={fix}"
        )
    os.environ[ENV] = "none"
    print(f"[{cfg.name}] computing in fp32 as its warm start did ({ENV}=none; this CPU has native bf16)", flush=True)
