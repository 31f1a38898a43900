"""What a unit's wall time should not count: ``<folder>/pauses.json``, written by hand.

A unit's ``seconds`` is the wall time of its process. When that process was stopped for a while
(``kill -STOP`` to give the machine to something else, then ``kill -CONT``), or shared the cores with
another job, the file says so::

    {"eval-real_env-s0": {"seconds": 2465, "why": "stopped with SIGSTOP while the test suite ran"},
     "eval-warm_start": {"seconds": 0, "why": "ran beside a test run: its seconds are inflated"}}

The report subtracts ``seconds`` from the unit's own and lists every entry with its reason, so a
pause is never silently a cost of the method. ``seconds: 0`` records a contention that cannot be
subtracted. A missing file means no pauses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envace.experiment.fields import Fields, is_number, read_json

PAUSES_FILE = "pauses.json"


@dataclass(frozen=True)
class Pause:
    """Seconds of a unit's wall time that were not the unit's work, and why."""

    seconds: float
    why: str


def read_pauses(folder: str | Path) -> dict[str, Pause]:
    """``unit key -> Pause`` from ``<folder>/pauses.json`` (empty when there is none).

    Raises:
        ValueError: naming the file and the field, when the file is not ``{unit: {seconds, why}}``
            with ``seconds`` a number at least 0 and ``why`` a non-empty string.
    """
    file = Path(folder) / PAUSES_FILE
    if not file.exists():
        return {}
    f = Fields(read_json(file), file)
    pauses = {}
    for unit in f.obj:
        entry = f.sub(unit)
        seconds = entry.get("seconds", lambda v: is_number(v) and v >= 0, "a number >= 0")
        why = entry.get("why", lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string")
        pauses[unit] = Pause(float(seconds), why.strip())
    return pauses


def less_pause(unit: str, seconds: float, pauses: dict[str, Pause], file: Path) -> float:
    """``seconds`` of ``unit`` less its recorded pause; a pause longer than the unit is an error."""
    pause = pauses.get(unit)
    if pause is None:
        return seconds
    if pause.seconds > seconds:
        raise ValueError(f"{file}: field 'seconds' {seconds} of unit {unit!r} is less than its pause {pause.seconds}")
    return seconds - pause.seconds
