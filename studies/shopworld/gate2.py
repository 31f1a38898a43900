"""Gate 2 of the ShopWorld study, the fidelity knob: its table and its verdict by rules.yaml.

    .venv/bin/python studies/shopworld/gate2.py

Reads each knob level's ``eval-warm_start`` unit (``knob-<E>/units/``, from ``knob-<E>.yaml``: the
warm start on N = 128 sft episodes and E exploration transitions), and E = 0 from gates 0 and 1 (the
same weights, bit-identical: gate 0's tune success of N = 128, gate 1's ``eval-warm_start`` on test).
Per level: the env calls its exploration cost, the rehearsals' fidelity to the real answers of the
gold calls (``decision_f1``, ``value_f1``, ``json_valid``; per split, mean over tasks) and tune success.
Rule (rules.yaml, gate 2): decision-relevant fidelity rises with E and is >= 0.9 at 4C; tune success
within 0.05 of E = 0's. Fidelity is judged in the call gold layout (rules.yaml's amendment of
2026-12-07), the turn layout's table and verdict printed beside; a row naming no layout is turn (files
written before layouts). A level not yet landed, or not yet measured in a layout (the landed E = 0 and
E = 368 evaluations get the call layout by ``envace experiment --add-fidelity call``), leaves the gate
undecided.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from statistics import fmean
from typing import Any

from envace.data.sources.shopworld import exploration

HERE = Path(__file__).resolve().parent
LEVELS = {368: "C/4", 1464: "C", 5856: "4C"}  # knob-<E>.yaml; C = 1,464 (gate 1's run-real_env-s0)
SCORES = ("decision_f1", "value_f1", "json_valid")
#: the gold layouts, the judged one first (rules.yaml's amendment of 2026-12-07: the call layout; the turn
#: layout, declared first, beside)
LAYOUTS = ("call", "turn")


def fidelity(unit: dict[str, Any], split: str, layout: str) -> dict[str, float]:
    """Mean per-task fidelity scores of ``split`` in the gold ``layout`` (a row naming none is ``turn``:
    files written before layouts; tasks with no scored pair left out; empty: not measured)."""
    rows = [f for f in unit["fidelity"] if f["split"] == split and f["pairs"] and f.get("layout", "turn") == layout]
    return {s: fmean(f[s] for f in rows if f[s] is not None) for s in SCORES} if rows else {}


def success(unit: dict[str, Any], split: str) -> float:
    items = [it for it in unit["items"] if it.get("split", split) == split]
    return fmean(float(it["success"]) for it in items)


def verdict(test_f1: dict[int, float], tune: dict[int, float], levels: tuple[int, ...] = (0, *LEVELS)) -> str:
    """Gate 2's rule on decision F1 (test) and tune success by E, E = 0 included; a level missing from
    either mapping has not landed.

    >>> verdict({0: 0.27, 368: 0.5, 1464: 0.8, 5856: 0.93}, {0: 0.315, 368: 0.3, 1464: 0.33, 5856: 0.35})
    'passes'
    >>> verdict({0: 0.27, 368: 0.5, 1464: 0.8, 5856: 0.85}, {0: 0.315, 368: 0.3, 1464: 0.33, 5856: 0.35})
    'fails: decision F1 at 4C is 0.850, under 0.9'
    >>> verdict({0: 0.27, 368: 0.5}, {0: 0.315, 368: 0.3})
    'undecided: E = 1464, 5856 not measured'
    """
    missing = [e for e in levels if e not in test_f1 or e not in tune]
    if missing:
        return f"undecided: E = {', '.join(map(str, missing))} not measured"
    f1 = [test_f1[e] for e in levels]
    if any(b <= a for a, b in itertools.pairwise(f1)):
        return "fails: decision F1 does not rise with E (" + ", ".join(f"{v:.3f}" for v in f1) + ")"
    if f1[-1] < 0.9:
        return f"fails: decision F1 at 4C is {f1[-1]:.3f}, under 0.9"
    off = [e for e in levels if abs(tune[e] - tune[0]) > 0.05]
    if off:
        return "fails: tune success moves more than 0.05 from E = 0 at E = " + ", ".join(map(str, off))
    return "passes"


def level(e: int) -> dict[str, Any] | None:
    """Knob level ``e``'s figures (``None`` before its ``eval-warm_start`` lands)."""
    path = HERE / f"knob-{e}" / "units" / "eval-warm_start.json"
    if not path.exists():
        return None
    unit = json.loads(path.read_text())
    calls = sum(t.extra["env_calls"] for t in exploration(e))
    return {
        "calls": calls,
        "tune": success(unit, "tune"),
        **{f"f_{split}_{layout}": fidelity(unit, split, layout) for split in ("tune", "test") for layout in LAYOUTS},
    }


def cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def main() -> None:
    gate0 = json.loads((HERE / "results" / "gate0" / "ws-128.json").read_text())
    ws = json.loads((HERE / "gate1" / "units" / "eval-warm_start.json").read_text())
    e0 = {f"f_test_{layout}": fidelity(ws, "test", layout) for layout in LAYOUTS}
    rows = {0: {"calls": 0, "tune": gate0["overall"], **e0}}
    rows |= {e: row for e in LEVELS if (row := level(e)) is not None}
    for layout in LAYOUTS:
        judged = "judged" if layout == LAYOUTS[0] else "beside"
        print(f"\n{layout} layout ({judged})\n")
        print("| E | level | env calls | tune success | decision F1 tune / test | value F1 test | json_valid test |")
        print("|---|---|---|---|---|---|---|")
        for e in (0, *LEVELS):
            r = rows.get(e)
            if r is None:
                print(f"| {e} | {LEVELS[e]} | not landed | | | | |")
                continue
            tune, test = r.get(f"f_tune_{layout}", {}), r[f"f_test_{layout}"]
            f1 = f"{cell(tune.get('decision_f1'))} / {cell(test.get('decision_f1'))}"
            print(f"| {e} | {LEVELS.get(e, '0')} | {r['calls']:,} | {r['tune']:.3f} | {f1} | "
                  f"{cell(test.get('value_f1'))} | {cell(test.get('json_valid'))} |")  # fmt: skip
        test_f1 = {e: r[f"f_test_{layout}"]["decision_f1"] for e, r in rows.items() if r[f"f_test_{layout}"]}
        print(f"gate 2 ({layout} layout):", verdict(test_f1, {e: r["tune"] for e, r in rows.items()}))


if __name__ == "__main__":
    main()
