"""The AVX2 loops of the native rescale (``opset/native/kernels.cpp``: rescale_avx2, iadd_run_avx2) equal the
numpy references bit for bit, at the edges of where they apply.

They run on x86-64 CPUs with AVX2 and without AVX-512F (``ivit_rescale_avx2`` says whether they do here)
for Requantize and its fused forms (RequantizeTable, with its lookups as gathers; RequantizeShiftmax) where
every multiplier is an int32, for IAdd where both are in [-2**62, 2**62), and every shift in 0..62: x * b is
then one (two) signed 32 x 32 -> 64-bit multiplies and the floor shift a logical one. The cases: int32
inputs at INT32_MIN/MAX, multipliers at -2**31, +-(2**31 - 1) and (IAdd) +-2**62, shifts 0, 1, 31, 62, per
tensor and per channel (along a row and along runs), every dtype pair, lengths off the 16-element step, zero
points and clip bounds at the extremes (also bounds outside the output type: the cast truncates), and the
numpy reference's wrap-around where the products overflow. Elsewhere the generic loops run (a Requantize
multiplier of 2**31, the tails): a subprocess with ``IVIT_NO_AVX2=1`` computes the same cases through them
only, and the outputs must agree byte for byte.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivit_onnx.opset import OPS, native_kernels
from tests.opset.oneop import INT_DTYPES, info, shiftmax_params

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="native kernels not built")
ROOT = Path(__file__).resolve().parents[2]
PROPERTY = settings(
    max_examples=int(os.environ.get("IVIT_OPSET_EXAMPLES", "80")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
CODES = {np.dtype(t): k for k, t in enumerate(INT_DTYPES)}
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
EDGE_MULTIPLIERS = [I32_MIN, I32_MIN + 1, -(1 << 30), -3, -1, 0, 1, 2, (1 << 30) + 1, I32_MAX - 1, I32_MAX]
EDGE_SHIFTS = [0, 1, 2, 31, 32, 61, 62]

#: IAdd's multipliers are wider (int8 inputs leave them ~53 bits): two multiplies up to |m| < 2**62
EDGE_WIDE = [1 << 31, I32_MIN - 1, (1 << 62) - 1, -(1 << 62), 4505280492056287, -26688173618901, 1 << 62,
             -(1 << 62) - 1, (1 << 63) - 1, -(1 << 63)]  # the last four: past the AVX2 loop, generic

multipliers = st.one_of(st.sampled_from(EDGE_MULTIPLIERS), st.integers(I32_MIN, I32_MAX))
wide_multipliers = st.one_of(multipliers, st.sampled_from(EDGE_WIDE), st.integers(-(1 << 62), (1 << 62) - 1))
shifts = st.one_of(st.sampled_from(EDGE_SHIFTS), st.integers(0, 62))
dtypes = st.sampled_from(INT_DTYPES)
lengths = st.one_of(st.sampled_from([1, 3, 4, 8, 15, 16, 17, 31, 32, 33, 47, 64, 100]), st.integers(1, 140))


def _lib():
    lib = native_kernels._LIB
    p, i, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ivit_requantize_table.argtypes = [p, c, i, i, i, p, p, p, i, i, i, p, p, c, c]
    lib.ivit_requantize_shiftmax.argtypes = [p, c, i, i, i, i, i, i, i, i, p, i, i, i, i, p, c, c]
    return lib


def tensor(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Random values of ``dtype`` with its extremes (and 0, +-1) sprinkled in, at the start and end too."""
    lo, hi = info(dtype)
    x = rng.integers(lo, hi, shape, endpoint=True, dtype=np.int64)
    flat = x.reshape(-1)
    edges = np.array([lo, hi, lo + 1, hi - 1, 0, -1 if lo < 0 else 1, 1], np.int64)
    picks = rng.random(flat.size) < 0.25
    flat[picks] = rng.choice(edges, int(picks.sum()))
    flat[0], flat[-1] = lo, hi
    return x.astype(dtype)


def zero_point(draw, dtype) -> int:
    lo, hi = info(dtype)
    return draw(st.one_of(st.sampled_from([lo, hi, 0, lo + 1, hi - 1]), st.integers(lo, hi)))


def bounds(draw, dtype, table: bool = False) -> tuple[int, int]:
    """qmin <= qmax: the output type's range, a part of it, or one past it (the cast wraps); for a table,
    inside the type and at most 4096 values apart."""
    lo, hi = info(dtype)
    if table:
        if hi - lo < 4096 and draw(st.booleans()):
            return lo, hi
        a = draw(st.one_of(st.sampled_from([lo, max(lo, hi - 4095)]), st.integers(lo, hi)))
        return a, min(hi, a + draw(st.integers(0, 4095)))
    kind = draw(st.sampled_from(["full", "part", "wide"]))
    if kind == "full":
        return lo, hi
    if kind == "part":
        a, b = draw(st.integers(lo, hi)), draw(st.integers(lo, hi))
        return min(a, b), max(a, b)
    return lo - draw(st.integers(0, 1 << 40)), hi + draw(st.integers(0, 1 << 40))


def check(got, want, what: str) -> None:
    assert got is not None, f"{what}: the native wrapper declined"
    assert got.dtype == want.dtype and got.shape == want.shape, what
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, (f"{what}: {bad.size} of {want.size} differ, first at flat {bad[0]}: "
                           f"{got.reshape(-1)[bad[0]]} != {want.reshape(-1)[bad[0]]}")


def native(op: str, *inputs, **attrs) -> np.ndarray:
    """The native result at 1 and 2 threads, checked against the reference; the reference."""
    want = OPS[op].reference(*inputs, **attrs)
    for threads in (1, 2):
        native_kernels.set_threads(threads)
        check(native_kernels.KERNELS[op](*inputs, **attrs), want, f"{op} ({threads} threads)")
    native_kernels.set_threads(None)
    return want


def test_path_reported():
    """Where the CPU has AVX2 and no AVX-512F and the build has the path, the library takes it."""
    probe = getattr(native_kernels._LIB, "ivit_rescale_avx2", None)
    if probe is None:
        pytest.skip("a library from before the AVX2 path")
    flag = probe()
    assert flag in (0, 1)
    if Path("/proc/cpuinfo").exists() and flag == 0 and not os.environ.get("IVIT_NO_AVX2"):
        flags = Path("/proc/cpuinfo").read_text().split()
        if "avx2" in flags and "avx512f" not in flags:
            pytest.skip("an AVX2 CPU, but a build without the AVX2 path (-DIVIT_NO_CLONES, or no GCC/clang)")


@PROPERTY
@given(data=st.data(), ti=dtypes, to=dtypes, layout=st.sampled_from(["tensor", "row", "runs"]),
       seed=st.integers(0, 2**32 - 1))
def test_requantize(data, ti, to, layout, seed):
    """Requantize per tensor, per channel along the last axis (rows) and along a middle axis (runs)."""
    draw = data.draw
    rng = np.random.default_rng(seed)
    n = draw(lengths)
    outer, mid = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    x = tensor(rng, ti, (outer, mid, n))
    if layout == "tensor":
        b, c = np.int64(draw(multipliers)), np.int64(draw(shifts))
    else:
        nc = n if layout == "row" else mid
        shape = (nc,) if layout == "row" else (nc, 1)
        b = np.array(draw(st.lists(multipliers, min_size=nc, max_size=nc)), np.int64).reshape(shape)
        c = np.array(draw(st.lists(shifts, min_size=nc, max_size=nc)), np.int64).reshape(shape)
    zx = ti(zero_point(draw, ti))
    qmin, qmax = bounds(draw, to)
    zy = np.array(zero_point(draw, to), to)
    native("Requantize", x, zx, b, c, zy, qmin=qmin, qmax=qmax)


@PROPERTY
@given(data=st.data(), ti=dtypes, to=dtypes, table=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_requantize_table_and_per_channel_zero_points(data, ti, to, table, seed):
    """ivit_requantize_table (the fused RequantizeTable: y = table[requantize(x) - qmin]) and, without a
    table, ivit_requantize_pc (a zero point per channel: the folded bias), every layout."""
    draw = data.draw
    rng = np.random.default_rng(seed)
    outer, nc, inner = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 5, 40])), draw(lengths)
    if nc > 5:
        inner = 1
    x = tensor(rng, ti, (outer, nc, inner))
    b = np.array(draw(st.lists(multipliers, min_size=nc, max_size=nc)), np.int64)
    c = np.array(draw(st.lists(shifts, min_size=nc, max_size=nc)), np.int64)
    zx = np.array([draw(st.one_of(st.integers(I32_MIN, I32_MAX), st.integers(-(1 << 62), 1 << 62)))
                   for _ in range(nc)], np.int64)
    qmin, qmax = bounds(draw, to, table=table)
    zy = zero_point(draw, to)
    want = OPS["Requantize"].reference(x, zx.reshape(nc, 1), b.reshape(nc, 1), c.reshape(nc, 1),
                                       np.array(zy, to), qmin=qmin, qmax=qmax)
    tab = None
    if table:
        tab = tensor(rng, to, (qmax - qmin + 1,))
        want = tab[want.astype(np.int64) - qmin]
    for threads in (1, 2):
        y = requantize_table(x, nc, inner, zx, b, c, zy, qmin, qmax, tab, to, threads)
        check(y, want, f"requantize_table ({threads} threads, table={table})")


@PROPERTY
@given(data=st.data(), ti=dtypes, to=st.sampled_from([np.uint8, np.int8, np.int16]),
       order=st.sampled_from(["increasing", "random"]), seed=st.integers(0, 2**32 - 1))
def test_requantize_shiftmax(data, ti, to, order, seed):
    """ivit_requantize_shiftmax: the rescale into table indices (sorted table) or values (any table)."""
    draw = data.draw
    rng = np.random.default_rng(seed)
    rows, length = draw(st.integers(1, 4)), draw(lengths)
    x = tensor(rng, ti, (rows, length))
    b, c, zx = draw(multipliers), draw(shifts), zero_point(draw, ti)
    qmin, qmax = draw(st.sampled_from([(-128, 127), (0, 255), (-300, 400), (-5, 5)]))
    zy = draw(st.integers(qmin, qmax))
    table = rng.integers(-3000, 3000, qmax - qmin + 1).astype(np.int32)
    if order == "increasing":
        table.sort()
    attrs = shiftmax_params(1.0 / 500, length, 8)
    y_zp = 0 if to == np.uint8 else -128 if to == np.int8 else 5
    v = OPS["Requantize"].reference(x, np.int64(zx), np.int64(b), np.int64(c), np.int64(zy), qmin=qmin,
                                    qmax=qmax)
    want = OPS["Shiftmax"].reference(table[v - qmin], np.array(y_zp, to), **attrs)
    lib = _lib()
    for threads in (1, 2):
        y = np.empty(x.shape, to)
        rc = lib.ivit_requantize_shiftmax(x.ctypes.data, CODES[x.dtype], rows, length, zx, b, c, zy, qmin,
                                          qmax, table.ctypes.data, y_zp, attrs["x0"], attrs["n"],
                                          attrs["bits"], y.ctypes.data, CODES[np.dtype(to)], threads)
        assert rc == 0
        check(y, want, f"requantize_shiftmax ({threads} threads, {order})")


@PROPERTY
@given(data=st.data(), ta=dtypes, tb=dtypes, to=dtypes, broadcast=st.sampled_from(["full", "row", "vector"]),
       seed=st.integers(0, 2**32 - 1))
def test_iadd(data, ta, tb, to, broadcast, seed):
    """IAdd, b full or repeating (a row of a, or its last axis), multipliers (int32 and wider) and zero points
    at the edges."""
    draw = data.draw
    rng = np.random.default_rng(seed)
    rows, n = draw(st.integers(1, 4)), draw(lengths)
    a = tensor(rng, ta, (rows, 2, n))
    bshape = {"full": (rows, 2, n), "row": (1, 2, n), "vector": (n,)}[broadcast]
    b = tensor(rng, tb, bshape)
    ma, mb, c = np.int64(draw(wide_multipliers)), np.int64(draw(wide_multipliers)), np.int64(draw(shifts))
    za, zb = ta(zero_point(draw, ta)), tb(zero_point(draw, tb))
    qmin, qmax = bounds(draw, to)
    zy = np.array(zero_point(draw, to), to)
    native("IAdd", a, b, za, zb, ma, mb, c, zy, qmin=qmin, qmax=qmax)
    if broadcast != "full":
        native("IAdd", b, a, zb, za, mb, ma, c, zy, qmin=qmin, qmax=qmax)  # the full operand second


def requantize_table(x, nc: int, inner: int, zx, b, c, zy: int, qmin: int, qmax: int, tab, to, threads):
    """ivit_requantize_table on x as (outer, nc, inner), zx/b/c int64 per channel (tab None: no table)."""
    y = np.empty(x.shape, to)
    args = (x.ctypes.data, CODES[x.dtype], x.size // (nc * inner), nc, inner, zx.ctypes.data, b.ctypes.data,
            c.ctypes.data, zy, qmin, qmax, None if tab is None else tab.ctypes.data, y.ctypes.data,
            CODES[np.dtype(to)], threads)
    assert _lib().ivit_requantize_table(*args) == 0
    return y


def edge_outputs() -> dict[str, np.ndarray]:
    """Deterministic native outputs on the AVX2 path's edges and just outside it (multipliers of +-2**31 and
    beyond, clip bounds with qmin > qmax, a tensor two threads split), for the byte comparison."""
    rng = np.random.default_rng(7)
    out = {}
    for ti in INT_DTYPES:
        x = tensor(rng, ti, (3, 7, 203))
        for to in INT_DTYPES:
            lo, hi = info(to)
            params = [(I32_MIN, 62, lo, hi), (I32_MAX, 0, lo, hi), (I32_MAX, 31, hi, lo), (-12345, 1, 3, -3),
                      (1 << 31, 40, lo, hi), (I32_MIN - 1, 40, lo, hi), (1 << 40, 62, lo, hi),
                      (3, 5, lo - 7, hi + 9)]
            for k, (b, c, qmin, qmax) in enumerate(params):
                for nc, inner in [(1, 1), (203, 1), (7, 203)]:
                    bs = np.full(nc, b, np.int64) + rng.integers(0, 2, nc)
                    cs = np.full(nc, c, np.int64)
                    zx = rng.integers(-(1 << 62), 1 << 62, nc).astype(np.int64)
                    zy = lo // 3 + 1
                    for threads in (1, 2):
                        y = requantize_table(x, nc, inner, zx, bs, cs, zy, qmin, qmax, None, to, threads)
                        out[f"rq {np.dtype(ti)} {np.dtype(to)} {k} {nc} {threads}"] = y
        for to in (np.int8, np.uint8):
            lo, hi = info(to)
            big = tensor(rng, ti, (5, 13, 1031))  # two threads split it at an odd point
            for k, (b, c) in enumerate([(I32_MIN, 40), (I32_MAX, 45), (1 << 31, 45)]):
                for nc, inner in [(1, 1), (1031, 1), (13, 1031)]:
                    bs, cs, zx = (np.full(nc, v, np.int64) for v in (b, c, 3))
                    y = requantize_table(big, nc, inner, zx, bs, cs, 1, lo, hi, None, to, 2)
                    out[f"big {np.dtype(ti)} {np.dtype(to)} {k} {nc}"] = y
            params = [(I32_MIN, I32_MAX, 62, lo, hi), (I32_MAX, I32_MIN, 0, hi, lo), (1 << 31, 5, 30, lo, hi),
                      (7, I32_MIN - 1, 30, lo, hi), (-1, 1, 1, lo - 1000, hi + 1000),
                      (4505280492056287, 26688173618901, 52, lo, hi), ((1 << 62) - 1, -(1 << 62), 62, hi, lo),
                      (1 << 62, 3, 40, lo, hi), (5, -(1 << 62) - 1, 40, lo, hi)]
            for k, (ma, mb, c, qmin, qmax) in enumerate(params):
                other = tensor(rng, ti, (7, 203))
                za, zb = ti(info(ti)[0]), ti(info(ti)[1])
                for threads in (1, 2):
                    native_kernels.set_threads(threads)
                    y = native_kernels.iadd(x, other, za, zb, np.int64(ma), np.int64(mb), np.int64(c),
                                            np.array(lo, to), qmin=qmin, qmax=qmax)
                    out[f"iadd {np.dtype(ti)} {np.dtype(to)} {k} {threads}"] = y
                native_kernels.set_threads(None)
    return out


def avx2_runs() -> bool:
    probe = getattr(native_kernels._LIB, "ivit_rescale_avx2", None) if native_kernels.available() else None
    return probe is not None and probe() == 1


@pytest.mark.skipif(not avx2_runs(), reason="the AVX2 loops do not run on this CPU or build")
def test_same_bytes_as_the_generic_loops(tmp_path):
    """The outputs of edge_outputs equal those of a process where only the generic loops run."""
    here = edge_outputs()
    path = tmp_path / "generic.npz"
    script = (f"import numpy as np\nfrom tests.opset.test_native_avx2 import edge_outputs\n"
              f"np.savez({str(path)!r}, **edge_outputs())\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "IVIT_NO_AVX2": "1"},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    generic = np.load(path)
    assert sorted(generic.files) == sorted(here)
    for key, y in here.items():
        assert y.dtype == generic[key].dtype and y.tobytes() == generic[key].tobytes(), key
