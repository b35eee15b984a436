"""QBatchMatMulShiftmax's rows (``ivit_index_shiftmax_rows``, ``opset/native/kernels.cpp``) equal a numpy
reference bit for bit: e = E[max k][k] per row, y = ((e * floor(RECIP_M / sum e)) >> (62 - bits)) + y_zp, or a
table after it. Byte outputs take the VBMI rows where the CPU has VBMI (E's byte planes from
``ivit_exp_planes``, looked up 64 at a time); a subprocess with ``IVIT_NO_VBMI=1`` runs the generic loops on
the same cases. The cases: E's largest entry from 1 to 8 bytes (the planes' count), tables of 1 to 256
entries, rows of 1 to past 4 vector steps (and past 256: the generic loops), constant rows, rows whose
largest index is the table's last, every output type, bits 1 to 30, a post table of each byte type."""
from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ivit_onnx.opset import native_kernels

ROOT = Path(__file__).resolve().parents[2]
RECIP_M = (1 << 62) - 1
CODES = {np.int8: 0, np.uint8: 1, np.int16: 2, np.int32: 3}

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="the native library is not built")


def lib():
    fn = native_kernels._LIB.ivit_index_shiftmax_rows
    P, I = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [P, I, I, P, I, P, I, I, I, P, ctypes.c_int, P]
    fn.restype = ctypes.c_int
    planes = native_kernels._LIB.ivit_exp_planes
    planes.argtypes = [P, I, P]
    planes.restype = ctypes.c_int
    return fn, planes


def exp_table(rng, nq: int, top_bits: int) -> np.ndarray:
    """E (nq x nq): row km has entries in 1..E[km][km] for k <= km, 0 past it, as ExpRows builds it; its
    largest entry has top_bits bits."""
    top = 1 << (top_bits - 1)
    e = np.zeros((nq, nq), np.int64)
    for km in range(nq):
        peak = int(rng.integers(top, 2 * top)) if km == nq - 1 or rng.random() < 0.5 else top
        e[km, : km + 1] = rng.integers(1, peak + 1, km + 1)
        e[km, km] = peak
    return e


def reference(k: np.ndarray, e: np.ndarray, y_zp: int, bits: int, dtype, post) -> np.ndarray:
    y = np.empty(k.shape, dtype)
    for r, row in enumerate(k):
        ev = e[row.max(), row.astype(np.int64)]
        f = RECIP_M // int(ev.sum())
        v = (ev * np.int64(f)) >> np.int64(62 - bits)  # e * f <= RECIP_M
        y[r] = post[v] if post is not None else (v + y_zp).astype(dtype)
    return y


def cases():
    """(name, k, e, y_zp, bits, dtype, post) for every case above; the rows' sums stay below 2**62."""
    rng = np.random.default_rng(7)
    out = []
    for top_bits in (1, 7, 8, 9, 16, 24, 32, 33, 41, 48, 53):
        for nq in (1, 7, 256):
            e = exp_table(rng, nq, top_bits)
            for length in (1, 5, 63, 64, 65, 197, 300):
                k = rng.integers(0, nq, (4, length)).astype(np.uint8)
                k[1] = k[1, 0]  # a constant row
                k[2, length // 2] = nq - 1  # its largest index the table's last
                for dtype, bits, y_zp in ((np.uint8, 8, 0), (np.int8, 8, -128), (np.int16, 15, -5),
                                          (np.int32, 30, 7), (np.uint8, 1, 3)):
                    name = f"b{top_bits} nq{nq} len{length} {np.dtype(dtype)} bits{bits}"
                    out.append((name, k, e, y_zp, bits, dtype, None))
                for dtype in (np.uint8, np.int8):
                    bits = int(rng.choice([4, 12, 16]))
                    info = np.iinfo(dtype)
                    post = rng.integers(info.min, info.max + 1, (1 << bits) + 1).astype(dtype)
                    out.append((f"b{top_bits} nq{nq} len{length} post {np.dtype(dtype)} bits{bits}", k, e, 0,
                                bits, dtype, post))
    return out


def run_cases() -> dict[str, np.ndarray]:
    """Each case through the library, as this process runs it."""
    fn, exp_planes = lib()
    got = {}
    planes_of = {}
    for name, k, e, y_zp, bits, dtype, post in cases():
        key = id(e)
        if key not in planes_of:
            planes = np.zeros(e.shape[0] * 8 * 256, np.uint8)
            npl = exp_planes(e.ctypes.data, e.shape[0], planes.ctypes.data)
            planes_of[key] = (planes, npl)
        planes, npl = planes_of[key]
        y = np.empty(k.shape, dtype)
        rc = fn(k.ctypes.data, k.shape[0], k.shape[1], e.ctypes.data, e.shape[0], planes.ctypes.data, npl,
                y_zp, bits, y.ctypes.data, CODES[dtype], None if post is None else post.ctypes.data)
        assert rc == 0, name
        got[name] = y
    return got


def test_planes_count():
    """ivit_exp_planes: the fewest bytes holding E's largest entry, each plane E's bytes; 0 for a negative
    entry or more than 256 indices."""
    _, exp_planes = lib()
    rng = np.random.default_rng(1)
    for top_bits, want in ((1, 1), (8, 1), (9, 2), (32, 4), (33, 5), (41, 6), (58, 8)):
        e = exp_table(rng, 5, top_bits)
        planes = np.zeros(5 * 8 * 256, np.uint8)
        assert exp_planes(e.ctypes.data, 5, planes.ctypes.data) == want, top_bits
        got = planes[: 5 * want * 256].reshape(5, want, 256)[:, :, :5].astype(np.int64)
        assert np.array_equal((got << (8 * np.arange(want))[None, :, None]).sum(1), e)
    e = exp_table(rng, 5, 8)
    e[2, 0] = -1
    assert exp_planes(e.ctypes.data, 5, planes.ctypes.data) == 0
    big = np.ones((257, 257), np.int64)
    assert exp_planes(big.ctypes.data, 257, np.zeros(8, np.uint8).ctypes.data) == 0


def test_rows_equal_the_reference():
    """Every case, in this process (the VBMI rows for byte outputs where the CPU has VBMI)."""
    got = run_cases()
    for name, k, e, y_zp, bits, dtype, post in cases():
        want = reference(k, e, y_zp, bits, dtype, post)
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name


def test_vbmi_path_reported():
    """The VBMI rows run exactly where the CPU has AVX-512 VBMI and IVIT_NO_VBMI is off."""
    flags = Path("/proc/cpuinfo").read_text() if platform.machine() == "x86_64" else ""
    want = "avx512vbmi" in flags and "avx512dq" in flags and os.environ.get("IVIT_NO_VBMI", "0") in ("", "0")
    assert native_kernels._LIB.ivit_shiftmax_vbmi() == int(want)


def test_generic_loops_give_the_same_bytes(tmp_path):
    """The cases in a process with the VBMI rows off (IVIT_NO_VBMI=1) equal this process's outputs."""
    out = tmp_path / "generic.npz"
    script = (f"import numpy as np\nfrom ivit_onnx.opset import native_kernels\n"
              f"from tests.opset.test_index_shiftmax import run_cases\n"
              f"path = np.array(native_kernels._LIB.ivit_shiftmax_vbmi())\n"
              f"np.savez({str(out)!r}, path=path, **run_cases())\n")
    python = os.environ.get("IVIT_GUEST_PYTHON", "").split() or [sys.executable]
    run = subprocess.run([*python, "-c", script], cwd=ROOT, env={**os.environ, "IVIT_NO_VBMI": "1"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    generic = dict(np.load(out))
    assert int(generic.pop("path")) == 0
    here = run_cases()
    assert sorted(generic) == sorted(here)
    for key, y in here.items():
        assert y.dtype == generic[key].dtype and y.tobytes() == generic[key].tobytes(), key
