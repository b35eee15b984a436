"""The row kernels' fast paths (``opset/native/kernels.cpp``: row_sums, layernorm_out_x/_avx2/_neon,
index_max/_avx2/_neon, softmax_out_avx2/_neon) equal the numpy references bit for bit, at the edges of where
they apply.

ILayerNorm and IL2Norm take the variance from one pass of sums (an identity that holds in int64's wrap-around
too); ILayerNorm's 8-bit rows run an explicit vector loop (AVX-512 on x86-64 CPUs with AVX-512 F, BW, DQ and
VL, where the output range fits the output type; AVX2 on x86-64 without AVX-512; NEON on aarch64) where
``0 <= shift_in <= 22``, ``len * (255 * 2**shift_in)**2 < 2**61``, ``p <= 30``, every multiplier is an int32
and every shift in 0..62. RequantizeShiftmax (sorted table) rescales into indices keeping the row's max,
on the vector loop where its multiplier is an int32, and its output loop runs for any exps. The cases: both
sides of each precondition, input extremes, constant rows, one outlier, lengths 1 to past the vector steps (8,
16), every output type, shifts 0, 1, 31, 62, reciprocals below and above 2**32 (one- and two-multiply
products). Subprocesses with only the generic loops (``IVIT_GENERIC_ROWS=1``), only the portable fast loops
(``IVIT_NO_AVX2=1``) and the AVX2 loops on AVX-512 CPUs too (``IVIT_ROWS_AVX2=1``) compute the same cases: the
bytes must agree with this process's (on an AVX-512 CPU, its AVX-512 loop).
"""
from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ivit_onnx.opset import OPS, native_kernels
from tests.opset.oneop import INT_DTYPES, info, shiftmax_params

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="native kernels not built")
ROOT = Path(__file__).resolve().parents[2]
CODES = {np.dtype(t): k for k, t in enumerate(INT_DTYPES)}
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
LENGTHS = [1, 2, 7, 8, 9, 15, 16, 17, 33, 197]


def rows_of(dtype, length: int, seed: int) -> np.ndarray:
    """Rows of ``dtype`` at its extremes: random, constant, alternating min/max, one outlier, all min/max."""
    lo, hi = info(dtype)
    lo, hi = max(lo, -(1 << 31)), min(hi, (1 << 31) - 1)
    rng = np.random.default_rng(seed)
    x = rng.integers(lo, hi, (6, length), endpoint=True)
    x[1] = (lo + hi) // 2 + 3
    x[2, ::2], x[2, 1::2] = lo, hi
    x[3] = lo
    x[3, length // 2] = hi
    x[4], x[5] = lo, hi
    return x.astype(dtype)


def check(op: str, got, want, what: str) -> None:
    assert got is not None, f"{op} {what}: the native wrapper declined"
    assert got.dtype == want.dtype and got.shape == want.shape, what
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, (f"{op} {what}: {bad.size} of {want.size} differ, first at {bad[0]}: "
                           f"{got.reshape(-1)[bad[0]]} != {want.reshape(-1)[bad[0]]}")


def layernorm_cases():
    """(x, b, c, bias, zy, attrs): inside and just outside the vector loop's preconditions."""
    rng = np.random.default_rng(7)
    for k, length in enumerate(LENGTHS + [1000]):
        for ti in (np.int8, np.uint8):
            x = rows_of(ti, length, k)
            for to in INT_DTYPES:
                olo, ohi = info(to)
                olo, ohi = max(olo, -(1 << 40)), min(ohi, 1 << 40)
                for shift_in, p, b, c in [(16, 30, 782260918, 51), (0, 0, I32_MAX, 0), (22, 30, I32_MIN, 62),
                                          (23, 30, 5, 40), (10, 31, 1 << 20, 40), (16, 30, 1 << 31, 62),
                                          (16, 30, 12345, 63), (1, 20, -3, 1), (22, 2, -(1 << 30), 31)]:
                    per = np.full(length, b, np.int64)
                    per[::3] = b // 7  # varies along the row, inside int32 where b is
                    cs = np.full(length, c, np.int64)
                    if c < 63:
                        cs[1::4] = max(c - 1, 0)
                    bias = rng.integers(-(1 << 45), 1 << 45, length).astype(np.int64)
                    zy = np.array((olo + ohi) // 2 if to != np.int32 else -5, to)
                    attrs = {"shift_in": shift_in, "p": p, "qmin": olo, "qmax": ohi}
                    yield x, per, cs, bias, zy, attrs
                    narrow = {**attrs, "qmin": olo + 1, "qmax": olo + 3}
                    yield x, per[:1], cs[:1], np.zeros(1, np.int64), zy, narrow
                    if c == 51 and to != np.int32:  # a range past the output type's: the cast truncates
                        wide = {**attrs, "qmin": olo - 300, "qmax": ohi + 300}
                        yield x, per[:1], cs[:1], bias[:1], zy, wide


def test_ilayernorm_edges():
    """ILayerNorm against the reference across the vector loop's preconditions, 1 and 2 threads."""
    n = 0
    for x, b, c, bias, zy, attrs in layernorm_cases():
        if attrs["p"] > 61 or not (c < 63).all():
            continue  # outside what the op takes (the wrapper declines)
        want = OPS["ILayerNorm"].reference(x, b, c, bias, zy, **attrs)
        for threads in (1, 2):
            native_kernels.set_threads(threads)
            check("ILayerNorm", native_kernels.ilayernorm(x, b, c, bias, zy, **attrs), want,
                  f"{x.dtype}->{zy.dtype} len {x.shape[-1]} {attrs} b {b[0]} c {c[0]} ({threads} threads)")
        n += 1
    native_kernels.set_threads(None)
    assert n > 300


@pytest.mark.parametrize("ti", INT_DTYPES)
def test_il2norm_and_wide_inputs(ti):
    """The one-pass sums for every input type (int32: wrap-around); IL2Norm's mean, a zero point."""
    lo, hi = info(ti)
    for length in (1, 16, 17, 300):
        x = rows_of(ti, length, length)
        b, c = np.array([I32_MAX], np.int64), np.array([45], np.int64)
        zx = np.array(lo // 3 + 1, ti)
        for shift_in, p in [(0, 30), (9, 30), (16, 20)]:
            attrs = {"shift_in": shift_in, "eps": 1, "p": p, "qmin": -128, "qmax": 127}
            want = OPS["IL2Norm"].reference(x, zx, b, c, np.int8(3), **attrs)
            check("IL2Norm", native_kernels.il2norm(x, zx, b, c, np.int8(3), **attrs), want, f"{ti} {length}")
            la = {"shift_in": shift_in, "p": p, "qmin": -128, "qmax": 127}
            want = OPS["ILayerNorm"].reference(x, b, c, np.zeros(1, np.int64), np.int8(0), **la)
            got = native_kernels.ilayernorm(x, b, c, np.zeros(1, np.int64), np.int8(0), **la)
            check("ILayerNorm", got, want, f"{ti} {length} {shift_in}")


def _lib():
    lib = native_kernels._LIB
    p, i, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ivit_requantize_shiftmax.argtypes = [p, c, i, i, i, i, i, i, i, i, p, i, i, i, i, p, c, c]
    return lib


def shiftmax_cases():
    """(x, zx, b, c, zy, qmin, qmax, table, to, y_zp, x0, n, bits): sorted tables (the index path)."""
    rng = np.random.default_rng(11)
    attrs = shiftmax_params(1.0 / 500, 197, 8)
    small = {"x0": 3, "n": 2, "bits": 8}  # exps <= 12: the reciprocal is >= 2**32 (two-multiply products)
    for k, length in enumerate(LENGTHS + [300]):
        for ti in (np.int8, np.uint8, np.int16, np.int32):
            x = rows_of(ti, length, 100 + k)
            for b, c, zx in [(1135961291, 38, 0), (I32_MAX, 62, 0), (I32_MIN, 31, 5), (1, 0, 0), (-3, 1, -2),
                             (1 << 31, 40, 0), (4, 0, 1)]:
                for (qmin, qmax), to, ex in [((-128, 127), np.uint8, attrs), ((-300, 400), np.int8, small),
                                             ((0, 1023), np.int16, attrs), ((-5, 5), np.int32, small)]:
                    table = np.sort(rng.integers(-3000, 3000, qmax - qmin + 1)).astype(np.int32)
                    zy = (qmin + qmax) // 2
                    y_zp = {np.uint8: 0, np.int8: -128, np.int16: 5, np.int32: -7}[to]
                    yield x, zx, b, c, zy, qmin, qmax, table, to, y_zp, ex["x0"], ex["n"], ex["bits"]
            for bits in (0, 1, 62):  # the output shift's extremes
                table = np.arange(256, dtype=np.int32) * 4 - 512
                yield x, 0, 1135961291, 38, 0, -128, 127, table, np.int32, 3, 1234, 30, bits


def requantize_shiftmax(x, zx, b, c, zy, qmin, qmax, table, to, y_zp, x0, n, bits, threads) -> np.ndarray:
    y = np.empty(x.shape, to)
    rc = _lib().ivit_requantize_shiftmax(x.ctypes.data, CODES[x.dtype], x.shape[0], x.shape[1], zx, b, c, zy,
                                         qmin, qmax, table.ctypes.data, y_zp, x0, n, bits, y.ctypes.data,
                                         CODES[np.dtype(to)], threads)
    assert rc == 0
    return y


def test_requantize_shiftmax_edges():
    """RequantizeShiftmax (sorted table) against Requantize, the table and Shiftmax's references."""
    for x, zx, b, c, zy, qmin, qmax, table, to, y_zp, x0, n, bits in shiftmax_cases():
        v = OPS["Requantize"].reference(x, np.int64(zx), np.int64(b), np.int64(c), np.int64(zy), qmin=qmin,
                                        qmax=qmax)
        want = OPS["Shiftmax"].reference(table[v - qmin], np.array(y_zp, to), x0=x0, n=n, bits=bits)
        for threads in (1, 2):
            got = requantize_shiftmax(x, zx, b, c, zy, qmin, qmax, table, to, y_zp, x0, n, bits, threads)
            check("RequantizeShiftmax", got, want, f"{x.dtype}->{np.dtype(to)} len {x.shape[1]} b {b} c {c} "
                  f"bits {bits} ({threads} threads)")


def edge_outputs() -> dict[str, np.ndarray]:
    """Every case above through the library as this process runs it (which loops: the environment's)."""
    out = {}
    for k, (x, b, c, bias, zy, attrs) in enumerate(layernorm_cases()):
        if attrs["p"] <= 61 and (c < 63).all():
            out[f"ln {k}"] = native_kernels.ilayernorm(x, b, c, bias, zy, **attrs)
    for k, case in enumerate(shiftmax_cases()):
        out[f"sm {k}"] = requantize_shiftmax(*case, threads=1)
    return out


def cpu_flags() -> list[str]:
    """The x86 CPU's flags as this process sees them (QEMU's model under emulation)."""
    return Path("/proc/cpuinfo").read_text().split("\nflags", 1)[-1].split("\n", 1)[0].split()


def rows_path() -> int:
    """The loops the row kernels take in this process: 0 generic, 1 portable, 2 AVX2, 3 NEON, 4 AVX-512
    (ILayerNorm's; the others' portable)."""
    return native_kernels._LIB.ivit_rows_path()


def env_on(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


def test_path_reported():
    """The vector loops run where they should: NEON on any aarch64 CPU; AVX-512 on x86-64 CPUs with AVX-512 F,
    BW, DQ and VL unless IVIT_NO_AVX2 or IVIT_ROWS_AVX2 is set; AVX2 where the AVX2 rescale runs (x86-64 with
    AVX2 and without AVX-512F: ivit_rescale_avx2), or on any AVX2 CPU with IVIT_ROWS_AVX2."""
    if platform.machine() in ("aarch64", "arm64"):
        want = 3
    elif platform.machine() == "x86_64":
        avx2 = native_kernels._LIB.ivit_rescale_avx2() == 1
        forced = env_on("IVIT_ROWS_AVX2") and not env_on("IVIT_NO_AVX2") and "avx2" in cpu_flags()
        # (the AVX2 rescale's choice too: QEMU's Haswell may show the host's flags in /proc/cpuinfo)
        avx512 = (not avx2 and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= set(cpu_flags())
                  and not env_on("IVIT_NO_AVX2") and not env_on("IVIT_ROWS_AVX2"))
        want = 4 if avx512 else 2 if avx2 or forced else 1
    else:
        pytest.skip(f"no vector loops on {platform.machine()}")
    assert rows_path() == (0 if env_on("IVIT_GENERIC_ROWS") else want)


@pytest.mark.parametrize("env,path", [("IVIT_GENERIC_ROWS", {0}), ("IVIT_NO_AVX2", {1, 3}),
                                      ("IVIT_ROWS_AVX2", {2, 3})])
def test_same_bytes_as_the_generic_loops(tmp_path, env, path):
    """The outputs of edge_outputs equal those of a process with the fast paths off (IVIT_GENERIC_ROWS), with
    only their portable loops (IVIT_NO_AVX2, x86), or with the AVX2 loops on AVX-512 CPUs too
    (IVIT_ROWS_AVX2); the subprocess reports which loops it took."""
    here = edge_outputs()
    out = tmp_path / "generic.npz"
    script = (f"import numpy as np\nfrom tests.opset.test_native_rows import edge_outputs, rows_path\n"
              f"np.savez({str(out)!r}, path=np.array(rows_path()), **edge_outputs())\n")
    python = os.environ.get("IVIT_GUEST_PYTHON", "").split() or [sys.executable]
    run = subprocess.run([*python, "-c", script], cwd=ROOT, env={**os.environ, env: "1"}, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    generic = dict(np.load(out))
    if platform.machine() == "x86_64" and env == "IVIT_ROWS_AVX2" and "avx2" not in cpu_flags():
        path = {1}
    assert int(generic.pop("path")) in path
    assert sorted(generic) == sorted(here)
    for key, y in here.items():
        assert y.dtype == generic[key].dtype and y.tobytes() == generic[key].tobytes(), key
