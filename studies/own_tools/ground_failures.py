"""A warm start against an MCP server that dies mid-way: what the grounded episodes hold (#53, item 1).

    PYTHONPATH=src python studies/own_tools/ground_failures.py [--tasks 8]

Starts tests/envs/servers/misbehaving.py in ``crash_later`` mode over streamable HTTP on 127.0.0.1
(it answers four calls, then exits), grounds ``--tasks`` one-call tasks against it with the tiny
tokenizer, and prints the DataModule's counters and how many tokenised episodes hold an error
observation. Run it with ``PYTHONPATH`` on another checkout's ``src`` for that code's figures.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envace.data.datamodule import EnvACEDataModule

SERVER = Path(__file__).resolve().parents[2] / "tests" / "envs" / "servers" / "misbehaving.py"
TOOLS = [{"name": "bump", "description": "Add.", "parameters": {"type": "object", "properties": {}}}]
ERRORS = ("SERVER_CRASHED", "SERVER_UNAVAILABLE", "TIMEOUT", "ENVIRONMENT_BROKEN", '"error"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    args = parser.parse_args()
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "crash_later", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            rows = Path(tmp) / "tasks.jsonl"
            row = {"user_turns": ["bump"], "gold": [[{"name": "bump", "arguments": {}}]], "tools": TOOLS}
            rows.write_text((json.dumps(row) + "\n") * args.tasks)
            env = {"kind": "mcp", "server": {"url": f"http://127.0.0.1:{port}/mcp", "call_timeout_s": 3}}
            source = {"name": "tasks", "split": "all", "path": str(rows), "options": {"env": env}}
            dm = EnvACEDataModule([source], tokenizer="tiny", tool_style="compact")
            if hasattr(dm, "max_ground_failed"):
                dm.max_ground_failed = 1.0  # let it finish, to count what it kept
            dm.setup("fit")
            texts = [dm.encoder.tokenizer.decode(ep.input_ids) for ep in dm.episodes]
    finally:
        proc.kill()
        proc.wait(10)
    counts = {k: v for k, v in sorted(dm.counts.items()) if k.startswith(("ground", "sft"))}
    holding = [t[-240:] for t in texts if any(e in t for e in ERRORS)]
    print(json.dumps({"counts": counts, "episodes": len(texts), "episodes_with_an_error_observation": len(holding),
                      "first_such_episode_ends": holding[:1]}))  # fmt: skip


if __name__ == "__main__":
    main()
