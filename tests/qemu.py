"""Running Python on an emulated CPU (QEMU user mode), the one way every test and script does it.

QEMU 7.2 (Debian bookworm's qemu-user) emulates the guest's ``brk`` heap without reserving the room it grows
into: a host mapping placed there is unmapped later by the host, and guest heap pages that glibc's malloc
wrote a moment before vanish (measured: the GEMM self-check read zeros, then faulted, in 1 of ~12 runs, ~1 in
2 without ASLR). ``GUEST_ENV`` makes the guest's malloc grow its heap once, by 1 GiB of untouched address
space, so the heap never grows into a host mapping. ``tests/arm/run.sh`` and ``.ci/run`` set the same.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

GUEST_ENV = {"GLIBC_TUNABLES": "glibc.malloc.top_pad=1073741824"}
QEMU_X86 = shutil.which("qemu-x86_64") if platform.machine() == "x86_64" else None


def haswell(code: str, timeout: int = 600, cwd: str | None = None, **env) -> subprocess.CompletedProcess:
    """``python -c code`` on an emulated Haswell (AVX2, no AVX-512, no VNNI)."""
    return subprocess.run([QEMU_X86 or "qemu-x86_64", "-cpu", "Haswell", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **GUEST_ENV, **env})
