"""What CPU this process runs on, in one line: model name and the integer-dot-product ISA that decides which
GEMM kernels are exact and fast (benchmarks print it; the exactness guard's warnings name it). On ARM, whose
/proc/cpuinfo has no model name, the core is named from its MIDR implementer and part."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

#: /proc/cpuinfo flags that matter for 8-bit GEMMs, in the order they are reported
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
#: the same on ARM (HWCAP names): 8-bit dot products (without, onnxruntime's int8 x int8 GEMM adds in int16)
ARM_FLAGS = ("asimddp", "i8mm", "sve", "sve2")
#: ARM cores by MIDR (implementer, part), as opset/native/gemm_check.cpp's ARM_CORES names them
ARM_CORES = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57", (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510", (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD80): "Cortex-A520", (0x41, 0xD81): "Cortex-A720", (0x41, 0xD82): "Cortex-X4",
    (0x41, 0xD84): "Neoverse-V3", (0x41, 0xD8E): "Neoverse-N3", (0x46, 0x001): "A64FX",
    (0x61, 0x022): "Apple M1", (0x61, 0x023): "Apple M1", (0x61, 0x032): "Apple M2",
    (0x61, 0x033): "Apple M2",
    (0xC0, 0xAC3): "Ampere-1",
}


def arm_core(text: str) -> str:
    """The ARM core a /proc/cpuinfo names by MIDR ("Cortex-A72"), or "" where it has none."""
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("CPU implementer", "CPU part") and key.strip() not in fields:
            fields[key.strip()] = int(value.strip(), 0)
    if len(fields) < 2:
        return ""
    key = (fields["CPU implementer"], fields["CPU part"])
    return ARM_CORES.get(key, f"an ARM64 CPU (MIDR implementer 0x{key[0]:02x}, part 0x{key[1]:03x})")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    path = Path("/proc/cpuinfo")
    name, flags = "", frozenset()
    if path.exists():
        text = path.read_text()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if not name and key.strip() == "model name":
                name = value.strip()
            elif not flags and key.strip() in ("flags", "Features"):
                flags = frozenset(value.split())
            if name and flags:
                break
        name = name or arm_core(text)
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
    if platform.machine() in ("aarch64", "arm64"):
        dot = [f for f in ARM_FLAGS if f in flags()]
        return " ".join(dot) if {"asimddp", "i8mm"} & set(dot) else ", ".join(["no dot product", *dot])
    if platform.machine() not in ("x86_64", "AMD64", "i686"):
        return platform.machine()
    return " ".join(have) + ("" if has_vnni() else ", no VNNI") if have else "no AVX2"


def describe() -> str:
    """``<model name> (<isa>)``: the line every benchmark and warning names the CPU with."""
    return f"{model_name()} ({isa()})"


__all__ = ["arm_core", "describe", "flags", "has_vnni", "isa", "model_name"]
