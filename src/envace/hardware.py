"""What this machine computes fast: the one place the package asks which precision to use.

CPUs differ by two orders of magnitude in bfloat16: with AVX512-BF16, AMX or the ARM BF16
extension a bf16 matmul runs 2-4x faster than fp32; without them (AVX2 machines: AMD Zen 2/3, Intel
before Cooper Lake, most laptops) PyTorch falls back to a scalar path ~100x slower than fp32, and
oneDNN refuses to prepack bf16 weights. Nothing here guesses from a processor's name:

* native bf16 arithmetic is *measured*: a small bf16 matmul against the same in fp32, once per
  process (a few ms; :func:`bf16_slowdown`). Native kernels run it at 2-4x the fp32 rate, the
  fallback ~100x slower, so the answer does not depend on knowing every CPU; the instruction-set
  flags the processor reports (``avx512_bf16``, ``amx_bf16``, ARM ``bf16``: ``/proc/cpuinfo``,
  ``sysctl`` on macOS) only explain it in the start-up line;
* prepacking is *tried*: a small weight is packed through oneDNN and its product compared with
  ``F.linear`` (:func:`can_prepack`), for each dtype, once per process.

``ENVACE_BF16=native|none`` forces the bf16 answer (``none`` also turns bf16 prepacking off), so
tests exercise both paths on any machine; ``auto`` or unset detects.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

ENV = "ENVACE_BF16"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 flags of native bf16 arithmetic
ARM_BF16_FEATURES = ("bf16",)  # aarch64 /proc/cpuinfo "Features"
FAST = 2.0  # bf16 counts as native when its matmul is at most this many times slower than fp32


@dataclass(frozen=True)
class Capability:
    """What this process can compute fast.

    Args:
        cpu_bf16: the CPU computes bfloat16 natively.
        reason: why, in a few words (``avx512_bf16 present``, ``no native bf16 on this CPU (AVX2)``,
            ``forced by ENVACE_BF16=none``).
        cpu_isa: PyTorch's kernel level (``torch.backends.cpu.get_cpu_capability()``).
        cuda: a CUDA device is visible.
        cuda_bf16: that device computes bfloat16 (Ampere and newer).
    """

    cpu_bf16: bool
    reason: str
    cpu_isa: str
    cuda: bool
    cuda_bf16: bool

    def as_dict(self) -> dict[str, object]:
        return {
            **self.__dict__,
            "prepack_fp32": can_prepack(torch.float32),
            "prepack_bf16": can_prepack(torch.bfloat16),
        }


def forced() -> str | None:
    """``native`` or ``none`` when ``ENVACE_BF16`` forces the answer, else ``None``."""
    value = os.environ.get(ENV, "auto").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("native", "none"):
        raise ValueError(f"{ENV}={value!r}: expected native, none or auto")
    return value


@cache
def _cpuinfo() -> dict[str, str]:
    """The first value of each key of ``/proc/cpuinfo`` (lower-cased keys); empty where there is none."""
    info = Path("/proc/cpuinfo")
    fields: dict[str, str] = {}
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def cpu_model() -> str | None:
    """The CPU's model name (``AMD EPYC ...``), for reports only: nothing is chosen from it."""
    return _cpuinfo().get("model name") or platform.processor() or None


@cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags (x86) or features (ARM) this CPU reports; empty when unreadable."""
    info = _cpuinfo()
    if info:
        return frozenset(info.get("flags", "").split() + info.get("features", "").split())
    if platform.system() == "Darwin":
        try:  # bounded: a sysctl that hangs must not hang start-up
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5, check=False
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return frozenset()
        return frozenset({"bf16"} if out == "1" else ())
    return frozenset()


def _detected_cpu_bf16() -> tuple[bool, str]:
    """Native bf16 as measured (:func:`bf16_slowdown` under :data:`FAST`), explained with the flags."""
    flags = cpu_flags()
    present = [f for f in BF16_FLAGS if f in flags]
    if platform.machine().lower() in ("aarch64", "arm64"):
        present += [f"arm {f}" for f in ARM_BF16_FEATURES if f in flags]
    slowdown = bf16_slowdown()
    measured = (
        f"bf16 matmul {1 / slowdown:.1f}x the fp32 rate"
        if slowdown < FAST
        else f"bf16 matmul {slowdown:.0f}x slower than fp32"
    )
    named = ", ".join(present) + " present" if present else f"no bf16 flag ({torch.backends.cpu.get_cpu_capability()})"
    if slowdown < FAST:
        return True, f"{named}; {measured}"
    return False, f"no native bf16 on this CPU: {named}; {measured}"


def capability() -> Capability:
    """The capability of this process (``ENVACE_BF16`` read at every call; probes run once)."""
    force = forced()
    if force is None:
        bf16, reason = _detected_cpu_bf16()
    else:
        bf16, reason = force == "native", f"forced by {ENV}={force}"
    cuda = torch.cuda.is_available()
    return Capability(
        cpu_bf16=bf16,
        reason=reason,
        cpu_isa=torch.backends.cpu.get_cpu_capability(),
        cuda=cuda,
        cuda_bf16=cuda and torch.cuda.is_bf16_supported(),
    )


def native_bf16(device: str = "cpu") -> bool:
    """Whether ``device`` (``cpu`` or ``cuda``) computes bfloat16 at full speed."""
    cap = capability()
    return cap.cuda_bf16 if device.startswith("cuda") else cap.cpu_bf16


@cache
def _prepack_works(dtype: torch.dtype) -> bool:
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 32, generator=g).to(dtype)
    x = torch.randn(3, 32, generator=g).to(dtype)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 8)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except RuntimeError:  # e.g. "bf16 path needs the cpu support avx_ne_convert or avx512bw, ..."
        return False
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return bool(torch.allclose(y.float(), torch.nn.functional.linear(x, w).float(), atol=tol, rtol=tol))


def can_prepack(dtype: torch.dtype) -> bool:
    """Whether oneDNN prepacks ``dtype`` linear weights here and gives ``F.linear``'s numbers (tried
    once per process); bf16 also needs native bf16 (``ENVACE_BF16=none`` turns it off)."""
    if dtype == torch.bfloat16 and not capability().cpu_bf16:
        return False
    return _prepack_works(dtype)


def training_precision(requested: str | int | None, device: str = "cpu") -> str | int | None:
    """``trainer.precision`` with ``auto`` resolved: ``bf16-mixed`` where ``device`` computes bf16
    natively, else ``32-true``. Any other value is returned as given."""
    if requested != "auto":
        return requested
    return "bf16-mixed" if native_bf16(device) else "32-true"


def sampling_dtype(requested: str | None, device: str = "cpu") -> str | None:
    """``sampling.dtype`` with ``auto`` resolved: ``bfloat16`` where ``device`` computes it natively,
    else ``None`` (the policy's own precision). Any other value is returned as given."""
    if requested != "auto":
        return requested
    return "bfloat16" if native_bf16(device) else None


@cache
def bf16_slowdown(size: int = 256) -> float:
    """How many times slower a ``size``² bf16 matmul runs than fp32 here (measured once per process,
    best of 5 on one thread: a busy second core then does not stall the measurement)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
            torch.mm(a, b)  # first call: kernel selection
            times = []
            for _ in range(5):
                began = time.perf_counter()
                torch.mm(a, b)
                times.append(time.perf_counter() - began)
            best[dtype] = min(times)
    finally:
        torch.set_num_threads(threads)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


def warn_if_slow(what: str, dtype: str | None, device: str = "cpu") -> None:
    """One line when ``what`` was asked explicitly in bf16 on a device that does not compute it."""
    asks_bf16 = dtype is not None and ("bf16" in str(dtype) or "bfloat16" in str(dtype))
    if not asks_bf16 or native_bf16(device):
        return
    ratio = bf16_slowdown() if device == "cpu" else float("nan")
    speed = f"bf16 matmuls run {ratio:.0f}x slower than fp32 here" if ratio >= FAST else "treated as emulated"
    warnings.warn(
        f"{what}={dtype} on a {device} without native bf16 ({capability().reason}): {speed}; "
        "use auto (or 32-true / float32)",
        stacklevel=2,
    )


def describe(what: str, requested: str | int | None, chosen: str | int | None, device: str = "cpu") -> str:
    """The start-up line of one choice: ``envace: trainer.precision auto -> 32-true (no native bf16
    on this CPU (AVX2))``, or ``... 32-true as configured (avx512_bf16 present)``."""
    cap = capability()
    why = cap.reason if device == "cpu" else ("bf16 supported" if cap.cuda_bf16 else "no bf16 on this GPU")
    how = f"auto -> {chosen}" if requested == "auto" else f"{chosen} as configured"
    return f"envace: {what} {how} on {device} ({why})"


_announced: set[str] = set()


def announce(line: str) -> None:
    """Print ``line`` to stderr once per process, on the first rank only."""
    if line in _announced or os.environ.get("RANK", "0") != "0" or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    _announced.add(line)
    print(line, file=sys.stderr, flush=True)
