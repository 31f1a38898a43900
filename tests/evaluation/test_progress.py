"""Progress lines: per item at most every ``every`` seconds (always the last), a heartbeat with the
tokens generated so far when nothing else was written, rate and time left, nothing when quiet."""

from __future__ import annotations

import io
import time

from envace.evaluation.progress import Progress, duration


def test_items_write_rate_limited_lines_and_always_the_last() -> None:
    out = io.StringIO()
    with Progress("evaluate x", 4, every=0.0, stream=out) as p:  # every 0: a line per item, no heartbeat
        for _ in range(4):
            p.advance()
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[1].split(",")[0] for line in lines] == ["1/4 items", "2/4 items", "3/4 items", "4/4 items"]
    assert lines[-1].endswith("eta 0s") and " item/s, " in lines[0]
    out = io.StringIO()
    with Progress("evaluate x", 100, every=3600, stream=out) as p:  # an hour apart: only the last is written
        for _ in range(100):
            p.advance()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[-1]] and "100/100 items" in out.getvalue()


def test_heartbeat_fills_gaps_with_the_tokens_generated() -> None:
    out, tokens = io.StringIO(), [0]
    with Progress("show t", 1, every=0.1, stream=out, unit="episodes") as p:
        p.track_tokens(lambda: tokens[0])
        for _ in range(12):  # 0.6 s of "generation", no item finishing
            time.sleep(0.05)
            tokens[0] += 10
        p.advance()
    lines = out.getvalue().splitlines()
    beats = [line for line in lines if "tok/s" in line]
    assert len(beats) >= 2 and all(b.startswith("show t: 0/1 episodes, 0.00 episode/s, eta ?; ") for b in beats)
    counts = [int(b.split(", ")[-1].split(" tokens")[0].replace(",", "")) for b in beats]
    assert counts == sorted(counts) and counts[-1] > counts[0] > 0
    assert lines[-1].startswith("show t: 1/1 episodes, ")


def test_quiet_writes_nothing_and_counts(capsys) -> None:
    with Progress("x", 2, every=0.01, quiet=True) as p:
        time.sleep(0.05)
        p.advance(2)
    assert p.done == 2 and p.lines == 1 and capsys.readouterr().err == ""


def test_duration() -> None:
    assert [duration(s) for s in (0, 59.4, 60, 3599, 3600, 7322)] == ["0s", "59s", "1m00s", "59m59s", "1h00m", "2h02m"]
