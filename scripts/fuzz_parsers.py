"""Fuzz the model-output parsers: N adversarial act and rehearsal strings, the exceptions they raise
(there should be none) and the time per parse. Prints one JSON object.

The strings are built from what breaks JSON readers: huge integers and exponents, NaN/Infinity,
escaped lone surrogates, deep and unbalanced nesting, tag soup, random unicode (surrogates
included), double-encoded arguments and long runs (up to ~1 MB), seeded so a run can be repeated.
``tests/protocol/test_parse.py`` runs the same properties through hypothesis at a few hundred
examples in ``make test``.

    .venv/bin/python scripts/fuzz_parsers.py                 # 100,000 strings
    .venv/bin/python scripts/fuzz_parsers.py --n 2000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import traceback

from envace.protocol import parse_act, parse_rehearsal

TOOLS = [
    {"name": "ls", "parameters": {"type": "object", "properties": {"a": {"type": "boolean"}}}},
    {
        "name": "cd",
        "parameters": {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]},
    },
    {"name": "fillFuelTank", "parameters": {"type": "object", "properties": {"fuelAmount": {"type": "number"}}}},
]
ATOMS = ['{', '}', '[', ']', '"', ':', ',', '\\', '\\u', '\\ud800', '\\udfff', '\\ud83d\\ude00', 'NaN',
         '-Infinity', 'Infinity', '1e999', '-1e-999', '0.', '-', 'e5', 'true', 'null', '"name"', '"arguments"',
         '"ls"', '"cd"', '<tool_call>', '</tool_call>', '<execution_result>', '</execution_result>', ' ', '\n',
         '\x00', '\ufeff']  # fmt: skip


def _number(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return "9" * rng.choice([10, 4299, 4301, 5000, 20_000])
    if kind == 1:
        return f"1e{rng.choice([308, 309, 999, 99999])}"
    if kind == 2:
        return rng.choice(["NaN", "Infinity", "-Infinity", "-0", "1.5e-400"])
    return str(rng.randint(-(10**30), 10**30))


def _unicode(rng: random.Random, n: int) -> str:
    return "".join(chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0xD800, 0xE000), rng.randrange(0x10FFFF)]))
                   for _ in range(n))  # fmt: skip


def _json_soup(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:  # deep nesting, balanced or not
        depth = rng.choice([10, 600, 10_000, 100_000])
        return "[" * depth + ("]" * depth if rng.random() < 0.5 else "")
    if kind == 1:
        return "".join(rng.choice(ATOMS) for _ in range(rng.randrange(1, 60)))
    if kind == 2:
        return json.dumps({rng.choice(["a", "folder", "fuelAmount"]): _number(rng)})[:-1].replace('"', "", 2) + "}"
    if kind == 3:
        return '{"' + _unicode(rng, rng.randrange(1, 20)) + '": "' + _unicode(rng, rng.randrange(1, 50)) + '"}'
    if kind == 4:  # a long value (up to ~1 MB)
        return '{"a": "' + "x" * rng.choice([10, 100_000, 1_000_000]) + '"}'
    return json.dumps(json.dumps({"folder": _unicode(rng, 5), "fuelAmount": _number(rng)}))


def adversarial(rng: random.Random) -> tuple[str, str]:
    """One (act, rehearsal) pair of strings."""
    body = _json_soup(rng)
    args = _json_soup(rng) if rng.random() < 0.7 else _number(rng)
    acts = [
        f"<tool_call>{body}</tool_call>",
        f'<tool_call>{{"name": "{rng.choice(["ls", "cd", "fillFuelTank", "rm"])}", "arguments": {args}}}</tool_call>',
        "".join(rng.choice(ATOMS) for _ in range(rng.randrange(1, 80))),
        f"text {_unicode(rng, 30)} <tool_call>{body}",
    ]
    rehearsals = [f"<execution_result>{body}</execution_result>", body, f"<execution_result>{args}",
                  f"<execution_result>{_unicode(rng, 40)}</execution_result>"]  # fmt: skip
    return rng.choice(acts), rng.choice(rehearsals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="pairs of strings (each parsed once)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    times: list[float] = []
    failures: list[dict[str, str]] = []
    began = time.perf_counter()
    for i in range(args.n):
        act, rehearsal = adversarial(rng)
        for fn, text in ((lambda t: parse_act(t, TOOLS, max_calls=4), act), (parse_rehearsal, rehearsal)):
            start = time.perf_counter()
            try:
                fn(text)
            except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
                failures.append(
                    {"input": repr(text[:200]), "error": "".join(traceback.format_exception_only(exc))[:300]}
                )
            times.append(time.perf_counter() - start)
        if (i + 1) % 10_000 == 0:
            print(f"{i + 1} pairs, {len(failures)} exceptions", file=sys.stderr, flush=True)
    times.sort()
    ms = {"median": statistics.median(times), "p99": times[int(0.99 * len(times))], "max": times[-1]}
    report = {"pairs": args.n, "parses": len(times), "exceptions": len(failures), "first_exceptions": failures[:5],
              "seconds": round(time.perf_counter() - began, 1),
              "per_parse_ms": {k: round(v * 1e3, 3) for k, v in ms.items()}}  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
