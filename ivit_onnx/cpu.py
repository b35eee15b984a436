"""What CPU this process runs on, in one line: model name and the integer-dot-product ISA that decides which
GEMM kernels are exact and fast (benchmarks print it; the exactness guard's warnings name it)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

#: /proc/cpuinfo flags that matter for 8-bit GEMMs, in the order they are reported
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    path = Path("/proc/cpuinfo")
    name, flags = "", frozenset()
    if path.exists():
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if not name and key.strip() == "model name":
                name = value.strip()
            elif not flags and key.strip() in ("flags", "Features"):
                flags = frozenset(value.split())
            if name and flags:
                break
    return name or platform.processor() or platform.machine(), flags


def model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what the platform module knows."""
    return _cpuinfo()[0]


def flags() -> frozenset[str]:
    return _cpuinfo()[1]


def has_vnni() -> bool:
    """Whether the CPU has an 8-bit dot product with 32-bit accumulation (AVX-512 VNNI or AVX-VNNI)."""
    return bool({"avx512_vnni", "avx_vnni"} & flags())


def isa() -> str:
    """The ISA that matters for 8-bit GEMMs: ``avx2, no VNNI``, ``avx2 avx512f avx512bw avx512_vnni``, ..."""
    have = [f for f in ISA_FLAGS if f in flags()]
    if platform.machine() not in ("x86_64", "AMD64", "i686"):
        return platform.machine()
    return " ".join(have) + ("" if has_vnni() else ", no VNNI") if have else "no AVX2"


def describe() -> str:
    """``<model name> (<isa>)``: the line every benchmark and warning names the CPU with."""
    return f"{model_name()} ({isa()})"


__all__ = ["describe", "flags", "has_vnni", "isa", "model_name"]
