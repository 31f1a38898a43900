"""What a grid shows while it runs and on ``--list``: units done, running and left, mean time per unit
kind, and an estimate of what is left."""

from __future__ import annotations

from envace.experiment.grid import ExperimentConfig, Unit, is_done, units


def progress(cfg: ExperimentConfig, grid: list[Unit], running: Unit | None, times: dict[str, list[float]]) -> str:
    """One block of text: done / running / left, mean time per unit kind, and an estimate of what is left."""
    done = [u for u in grid if is_done(cfg, u)]
    left = [u for u in grid if not is_done(cfg, u) and u is not running]
    mean = {k: sum(v) / len(v) for k, v in times.items() if v}
    untimed = sorted({u.kind for u in left} - set(mean))
    per = ", ".join(f"{k} {_hms(v)}" for k, v in sorted(mean.items())) or "no unit timed yet"
    now = f" | running: {running.key}" if running else ""
    if untimed:
        est = f" | an estimate once a {' and a '.join(untimed)} unit is timed" if left else ""
    else:
        est = f" | about {_hms(sum(mean[u.kind] for u in left))} left" if left else ""
    return f"[{cfg.name}] done {len(done)}/{len(grid)}{now} | left {len(left)} | per unit: {per}{est}"


def listing(cfg: ExperimentConfig) -> str:
    """``--list``: every unit, its index, what it needs and whether it is done."""
    grid = units(cfg)
    w = max([28, *(len(u.key) for u in grid)])
    lines = [f"{'#':>3}  {'unit':<{w}} {'needs':<28} status"]
    for i, unit in enumerate(grid):
        status = "done" if is_done(cfg, unit) else "to do"
        lines.append(f"{i:>3}  {unit.key:<{w}} {','.join(unit.needs) or '-':<28} {status}")
    return "\n".join(lines)


def _hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
