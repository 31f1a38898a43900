"""Compare fits' logged curves: the RL reward per step and the validation figures, over seeds.

Made for the vLLM issue's check that a fit rolled out on vLLM matches the same fit on our engine
(same config, same seeds; docs/vllm.md, "A fit on each engine"), usable for any TensorBoard runs::

    python studies/engine_fits/compare_fits.py --a runs/bfcl/engine_ours --b runs/bfcl/engine_vllm
    python studies/engine_fits/compare_fits.py --a studies/engine_fits/results/ours-s*.json \\
                                   --b studies/engine_fits/results/vllm-s*.json
    python studies/engine_fits/compare_fits.py --save runs/bfcl/engine_ours_s1 ours-s1.json --time-log time.txt

A run is a TensorBoard folder or a summary file that ``--save`` wrote from one (its curves, and the
wall time and peak memory of ``/usr/bin/time -v`` when given): the summaries are small enough to
commit, so a comparison over several sessions reads them rather than event files that a new machine
no longer has. ``--a`` and ``--b`` name one run per seed, in the same seed order.

Prints, as markdown: with one run a side, each validation tag at each logged step for both and the
RL reward per step, with the difference of the mean RL reward (b − a): Welch over steps and paired by
step (with the same seed both runs draw the same tasks at each step). With more, one row per run,
then b − a over the runs' means, Welch and paired by seed: the seeds, not the steps, are the
independent samples once the policies diverge.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from statistics import mean, variance
from typing import Any

VAL_TAGS = (
    "val/committed/official_success/all",
    "val/committed/proxy_score/all",
    "val/committed/act_tool_f1/all",
)
REWARD_TAG = "train/reward/all"
Curves = dict[str, dict[int, float]]


def scalars(folder: str) -> Curves:
    """Every scalar tag of a TensorBoard run folder: tag -> {step: value} (the last value per step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def load(run: str) -> dict[str, Any]:
    """A run's summary: ``curves`` (the compared tags) and, from a summary file, its other fields."""
    if run.endswith(".json"):
        data = json.loads(Path(run).read_text())
        data["curves"] = {t: {int(s): v for s, v in c.items()} for t, c in data["curves"].items()}
        return data
    found = scalars(run)
    return {"run": run, "curves": {t: found[t] for t in (*VAL_TAGS, REWARD_TAG) if t in found}}


def time_log(text: str) -> dict[str, float]:
    """Wall seconds and peak resident GB from the report of ``/usr/bin/time -v``.

    >>> time_log("Elapsed (wall clock) time (h:mm:ss or m:ss): 15:04.20\\nMaximum resident set size (kbytes): 7550000")
    {'wall_s': 904.2, 'peak_rss_gb': 7.55}
    """
    out = {}
    if m := re.search(r"Elapsed \(wall clock\) time.*: ([\d:.]+)", text):
        parts = [float(p) for p in m.group(1).split(":")]
        out["wall_s"] = round(sum(p * 60**i for i, p in enumerate(reversed(parts))), 1)
    if m := re.search(r"Maximum resident set size \(kbytes\): (\d+)", text):
        out["peak_rss_gb"] = round(int(m.group(1)) / 1e6, 2)
    return out


# Student's t, two-sided 95 %, by degrees of freedom: with two or three seeds a side the normal
# quantile (1.96) would give intervals half as wide as they are.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
       2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
       2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t95(df: float) -> float:
    """The 97.5 % quantile of Student's t at ``df`` degrees of freedom (floored; 1.96 past 30).

    >>> t95(2), t95(2.7), t95(500)
    (4.303, 4.303, 1.96)
    """
    return T95[int(df) - 1] if df < len(T95) + 1 else 1.96


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(b) − mean(a) and its 95 % Welch interval (unequal variances, Welch–Satterthwaite df).

    >>> [round(x, 3) for x in welch([0.2, 0.4, 0.3], [0.5, 0.7, 0.6])]
    [0.3, 0.073, 0.527]
    """
    va, vb = variance(a) / len(a), variance(b) / len(b)
    diff, se = mean(b) - mean(a), math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if va + vb > 0 else math.inf
    return diff, diff - t95(df) * se, diff + t95(df) * se


def paired(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(b − a) over paired values and its 95 % t interval (n − 1 degrees of freedom).

    >>> [round(x, 3) for x in paired([0.375, 0.258, 0.359], [0.250, 0.234, 0.281])]
    [-0.076, -0.201, 0.05]
    """
    d = [y - x for x, y in zip(a, b, strict=True)]
    half = t95(len(d) - 1) * math.sqrt(variance(d) / len(d))
    return mean(d), mean(d) - half, mean(d) + half


def per_step(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """One run a side: every validation point and every RL step's reward, with intervals over steps."""
    ca, cb = a["curves"], b["curves"]
    lines = [f"a = `{a['run']}`, b = `{b['run']}`", "", "| tag | step | a | b |", "|---|---|---|---|"]
    for tag in VAL_TAGS:
        for step in sorted(set(ca.get(tag, {})) | set(cb.get(tag, {}))):
            lines.append(f"| {tag} | {step} | {_f(ca.get(tag, {}).get(step))} | {_f(cb.get(tag, {}).get(step))} |")
    ra, rb = ca.get(REWARD_TAG, {}), cb.get(REWARD_TAG, {})
    lines += ["", f"`{REWARD_TAG}` per RL step:", "", "| step | a | b |", "|---|---|---|"]
    lines += [f"| {s} | {_f(ra.get(s))} | {_f(rb.get(s))} |" for s in sorted(set(ra) | set(rb))]
    if len(ra) > 1 and len(rb) > 1:
        d, lo, hi = welch(list(ra.values()), list(rb.values()))
        means = f"a {mean(ra.values()):.3f} ({len(ra)} steps), b {mean(rb.values()):.3f} ({len(rb)} steps)"
        lines += ["", f"mean reward: {means}; b − a = {d:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 %, Welch over steps)"]
        if set(ra) == set(rb):
            d, lo, hi = paired([ra[s] for s in sorted(ra)], [rb[s] for s in sorted(rb)])
            lines += [f"paired by step: b − a = {d:+.3f} [{lo:+.3f}, {hi:+.3f}] (95 %, t over step differences)"]
    return lines


def figures(run: dict[str, Any]) -> dict[str, float | None]:
    """A run's compared figures: the mean RL reward over its steps and each validation tag's last value."""
    curves = run["curves"]
    reward = curves.get(REWARD_TAG, {})
    out: dict[str, float | None] = {"mean RL reward": mean(reward.values()) if reward else None}
    for tag in VAL_TAGS:
        values = curves.get(tag, {})
        out[f"{tag.split('/')[2]} (last val)"] = values[max(values)] if values else None
    return out


def over_seeds(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """One row per run, then b − a of each figure over the runs: Welch, and paired by seed order."""
    names = list(figures(a[0]))
    lines = ["| side | run | " + " | ".join(names) + " | wall s | peak GB |", "|---" * (len(names) + 4) + "|"]
    for side, runs in (("a", a), ("b", b)):
        for run in runs:
            cells = [_f(v) for v in figures(run).values()]
            lines.append(f"| {side} | `{run['run']}` | " + " | ".join(cells) + f" | {_f(run.get('wall_s'), 0)} | "
                         f"{_f(run.get('peak_rss_gb'), 2)} |")  # fmt: skip
    lines += ["", "b − a over runs (95 %, Student's t):", "", "| figure | a | b | Welch | paired by seed |",
              "|---|---|---|---|---|"]  # fmt: skip
    for name in names:
        va = [v for v in (figures(r)[name] for r in a) if v is not None]
        vb = [v for v in (figures(r)[name] for r in b) if v is not None]
        if len(va) < 2 or len(vb) < 2:
            continue
        w = _interval(welch(va, vb))
        p = _interval(paired(va, vb)) if len(va) == len(vb) else "—"
        lines.append(f"| {name} | {mean(va):.3f} | {mean(vb):.3f} | {w} | {p} |")
    return lines


def _interval(d: tuple[float, float, float]) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", nargs="+", default=[], help="runs of one side, one per seed (folders or .json)")
    parser.add_argument("--b", nargs="+", default=[], help="runs of the other side, in the same seed order")
    parser.add_argument("--save", nargs=2, metavar=("FOLDER", "OUT"), help="write FOLDER's summary to OUT")
    parser.add_argument("--time-log", help="with --save: a /usr/bin/time -v report of the fit")
    parser.add_argument("--commit", help="with --save: the commit the fit ran at")
    args = parser.parse_args()
    if args.save:
        folder, out = args.save
        summary = {**load(folder), "run": Path(folder).name, "commit": args.commit}
        summary.update(time_log(Path(args.time_log).read_text()) if args.time_log else {})
        Path(out).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        return
    if not args.a or not args.b:
        parser.error("give --a and --b (or --save)")
    a, b = [load(r) for r in args.a], [load(r) for r in args.b]
    print("\n".join(per_step(a[0], b[0]) if len(a) == len(b) == 1 else over_seeds(a, b)))


if __name__ == "__main__":
    main()
