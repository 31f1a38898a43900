"""Generate the clinic example's tasks with gold calls: ``examples/clinic_mcp/tasks/{train,val,test}.jsonl``.

    python examples/clinic_mcp/make_tasks.py [--n 300] [--seed 0]

Five kinds of request, one user turn each: free slots (``find_slots``), a booking
(``book_appointment``), and a booking followed by a call on the id its response assigns (``V101``
in a fresh session): lab tests (``order_tests``, an array of test objects), a move
(``reschedule_appointment``) or a cancellation (``cancel_appointment``). Split 70/15/15 by task; the
kinds cycle within each split (every split holds each kind in equal shares), and half of the test
split's tasks, in every kind, name doctors held out of training.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from server import DAYS, DOCTORS, FIRST_ID, HOURS, TESTS  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent
KINDS = ("slots", "book", "tests", "reschedule", "cancel")
PATIENTS = ("Ana Lima", "Ben Okafor", "Chloe Martin", "Dev Rao", "Eva Novak", "Finn Walsh", "Grace Kim", "Hugo Berg")
SYSTEM = "You are the clinic's booking assistant. Use the tools to answer; reuse the ids the tools return."


def request(kind: str, doctor: str, rng: random.Random) -> tuple[str, list[dict]]:
    day, time, patient = rng.choice(DAYS), rng.choice(HOURS), rng.choice(PATIENTS)
    vid = f"V{FIRST_ID}"
    book = {"name": "book_appointment", "arguments": {"doctor": doctor, "day": day, "time": time, "patient": patient}}
    booking = rng.choice(["Book {p} with {d} on {day} at {t}", "{p} needs {d} on {day} at {t}: book it"])
    booking = booking.format(p=patient, d=doctor, day=day, t=time)
    if kind == "slots":
        ask = rng.choice(["When is {d} free on {day}?", "Which hours does {d} have open on {day}?"])
        return ask.format(d=doctor, day=day), [{"name": "find_slots", "arguments": {"doctor": doctor, "day": day}}]
    if kind == "book":
        return booking + ".", [book]
    if kind == "tests":
        codes = rng.sample(sorted(TESTS), rng.randint(1, 2))
        fasting = rng.random() < 0.5
        tests = [{"code": c, "fasting": fasting} for c in codes]
        how = "fasting" if fasting else "not fasting"
        return f"{booking}, then order {' and '.join(codes)} for it ({how}).", [
            book,
            {"name": "order_tests", "arguments": {"appointment_id": vid, "tests": tests}},
        ]
    if kind == "reschedule":
        new_day = rng.choice([d for d in DAYS if d != day])
        new_time = rng.choice(HOURS)
        return f"{booking}, then move it to {new_day} at {new_time}.", [
            book,
            {"name": "reschedule_appointment", "arguments": {"appointment_id": vid, "day": new_day, "time": new_time}},
        ]
    return f"{booking}, then cancel that appointment.", [
        book,
        {"name": "cancel_appointment", "arguments": {"appointment_id": vid}},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "tasks")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    doctors = sorted(DOCTORS)
    held_out = set(doctors[-2:])  # test: two doctors never named in training
    rows: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for i in range(args.n):
        split = "train" if i % 20 < 14 else "val" if i % 20 < 17 else "test"
        k = len(rows[split])  # cycles counted within the split
        pool = sorted(held_out) if split == "test" and k // 5 % 2 == 0 else [d for d in doctors if d not in held_out]
        kind = KINDS[k % 5]
        text, gold = request(kind, rng.choice(pool), rng)
        rows[split].append(
            {
                "id": f"clinic-{i:04d}",
                "user_turns": [text],
                "gold": [gold],
                "system_prompt": SYSTEM,
                "metadata": {"category": kind},
            }
        )
    args.out.mkdir(parents=True, exist_ok=True)
    for split, items in rows.items():
        with (args.out / f"{split}.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in items)
        print(f"{args.out / f'{split}.jsonl'}: {len(items)} tasks")


if __name__ == "__main__":
    main()
