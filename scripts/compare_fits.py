"""Compare two fits' logged curves: the RL reward per step and the validation figures.

Made for the vLLM issue's check that a fit rolled out on vLLM matches the same fit on our engine
(same config, same seed; docs/vllm.md, "A fit on each engine"), usable for any two TensorBoard runs::

    python scripts/compare_fits.py runs/bfcl/engine_ours runs/bfcl/engine_vllm

Prints, as markdown: each validation tag at each logged step for both runs; the RL reward per step
for both; and the difference of the mean RL reward (b − a) with 95 % intervals: Welch, the steps as
samples (each step's reward is the mean of that step's episodes), and paired by step (with the same
seed both runs draw the same tasks at each step, so pairing removes the tasks' difficulty). Two runs
whose samples come from different random streams differ by sampling noise alone; the intervals say
how large that is.
"""

from __future__ import annotations

import argparse
import math
from statistics import NormalDist, mean, variance

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

VAL_TAGS = (
    "val/committed/official_success/all",
    "val/committed/proxy_score/all",
    "val/committed/act_tool_f1/all",
)
REWARD_TAG = "train/reward/all"


def scalars(folder: str) -> dict[str, dict[int, float]]:
    """Every scalar tag of a TensorBoard run folder: tag -> {step: value} (the last value per step)."""
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def welch(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """mean(b) − mean(a) and its normal-approximation interval (unequal variances)."""
    diff = mean(b) - mean(a)
    se = math.sqrt(variance(a) / len(a) + variance(b) / len(b))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return diff, diff - z * se, diff + z * se


def paired(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """mean(b − a) over paired values and its normal-approximation interval."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    half = NormalDist().inv_cdf(0.5 + level / 2) * math.sqrt(variance(d) / len(d))
    return mean(d), mean(d) - half, mean(d) + half


def report(a: str, b: str) -> list[str]:
    sa, sb = scalars(a), scalars(b)
    lines = [f"a = `{a}`, b = `{b}`", "", "| tag | step | a | b |", "|---|---|---|---|"]
    for tag in VAL_TAGS:
        for step in sorted(set(sa.get(tag, {})) | set(sb.get(tag, {}))):
            va, vb = sa.get(tag, {}).get(step), sb.get(tag, {}).get(step)
            lines.append(f"| {tag} | {step} | {_f(va)} | {_f(vb)} |")
    ra, rb = sa.get(REWARD_TAG, {}), sb.get(REWARD_TAG, {})
    lines += ["", f"`{REWARD_TAG}` per RL step:", "", "| step | a | b |", "|---|---|---|"]
    lines += [f"| {s} | {_f(ra.get(s))} | {_f(rb.get(s))} |" for s in sorted(set(ra) | set(rb))]
    if len(ra) > 1 and len(rb) > 1:
        d, lo, hi = welch(list(ra.values()), list(rb.values()))
        means = f"a {mean(ra.values()):.3f} ({len(ra)} steps), b {mean(rb.values()):.3f} ({len(rb)} steps)"
        lines += ["", f"mean reward: {means}; b − a = {d:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 %, Welch over steps)"]
        if set(ra) == set(rb):
            d, lo, hi = paired([ra[s] for s in sorted(ra)], [rb[s] for s in sorted(rb)])
            lines += [f"paired by step: b − a = {d:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 %, normal over step differences)"]
    return lines


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="a TensorBoard run folder (runs/bfcl/engine_ours)")
    parser.add_argument("b", help="another (runs/bfcl/engine_vllm)")
    args = parser.parse_args()
    print("\n".join(report(args.a, args.b)))


if __name__ == "__main__":
    main()
