"""The compiled kernels (``opset/native``) equal the numpy references bit for bit, on the paths they take.

``tests.opset.test_bitexact`` already runs them on every hypothesis example (``native_1t``/``native_3t``
in :func:`tests.opset.oneop.run_all_ways`), mostly small tensors. Here: the exp-table paths of Shiftmax
and ShiftGELU (large tensors whose range crosses the exp clamp point, and ranges too wide for a table),
per-channel layouts on every axis, results independent of the thread count, and the numpy fallback.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset.shift_exp import max_n
from tests.opset.oneop import INT_DTYPES, info

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="native kernels not built")
RNG = np.random.default_rng(20261122)


def both(op: str, *inputs, **attrs) -> np.ndarray:
    """Native result (must be taken natively) after checking it equals the reference, dtype and bits."""
    ref = OPS[op].reference(*inputs, **attrs)
    for threads in (1, 2, 5):
        native_kernels.set_threads(threads)
        got = native_kernels.KERNELS[op](*inputs, **attrs)
        assert got is not None, f"{op}: the native wrapper declined a supported call"
        assert got.dtype == ref.dtype and got.shape == ref.shape
        bad = np.flatnonzero(got.reshape(-1) != ref.reshape(-1))
        assert bad.size == 0, (f"{op} ({threads} threads): {bad.size} of {ref.size} differ, first at flat "
                               f"{bad[0]}: {got.reshape(-1)[bad[0]]} != {ref.reshape(-1)[bad[0]]}")
    native_kernels.set_threads(None)
    return ref


def test_built_with_the_project():
    """CI installs with a compiler: the kernels must be there (IVIT_NATIVE_LIB='' opts out on purpose)."""
    assert os.environ.get("IVIT_NATIVE_LIB") != "" and native_kernels.library_path() is not None


@pytest.mark.parametrize("x0,n", [(1, 30), (3, 30), (37, 12), (1234, 30), (5000, 20), (1 << 20, 30)])
@pytest.mark.parametrize("span", [64, 3000, 70000, 1 << 30])
def test_shiftmax_tables_and_clamp(x0, n, span):
    """Rows whose spread runs from 0 past the clamp point (table, clamped lookups) or past any table."""
    n = min(n, max_n(x0, 197))
    x = RNG.integers(-span // 2, span // 2, (600, 197), endpoint=True).astype(np.int32)
    x[:, 0] = span // 2  # every row has its max far from its min
    x[1, :] = np.arange(197) * (span // 197 + 1) - span // 2  # evenly spread, through the clamp point
    y = both("Shiftmax", x, np.uint8(0), x0=x0, n=n, bits=8)
    assert y.max() > 0


@pytest.mark.parametrize("x0,n", [(50, 2), (50, 3), (9, 1)])
def test_shiftmax_clamp_boundary_visible(x0, n):
    """Small n and 30 output bits: exps just before and past the clamp point give different outputs."""
    x = np.tile(np.arange(-400, 1, dtype=np.int32), (30, 1))
    y = both("Shiftmax", x, np.int32(0), x0=x0, n=n, bits=30)
    assert len(np.unique(y[0])) >= 6  # resolved up to the clamp point, not one value


@pytest.mark.parametrize("nc", [1, 16])
@pytest.mark.parametrize("x0,n", [(50, 3), (9, 1), (3, 0)])
def test_shiftgelu_clamp_boundary_visible(nc, x0, n):
    """Every v in [-2000, 2000] with small n and 28 sigmoid bits, so sg differs on both sides of the clamp."""
    x = np.resize(np.arange(-2000, 2001, dtype=np.int16), (250, 16))
    b = np.full((nc,), 1 << 8, np.int64) + np.arange(nc)
    c = np.full((nc,), 30, np.int64)
    both("ShiftGELU", x, b, c, np.int32(0), x0=x0, n=n, bits=28, qmin=-(1 << 31), qmax=(1 << 31) - 1)


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("x0", [1, 7, 1045, 40000])
def test_shiftgelu_tables_and_clamp(dtype, x0):
    """Every value of a narrow type (the whole table), and int32 ranges beyond the clamp point."""
    lo, hi = info(dtype)
    lo, hi = max(lo, -(1 << 22)), min(hi, 1 << 22)
    x = RNG.integers(lo, hi, (64, 3000), endpoint=True).astype(dtype)
    if hi - lo + 1 <= x.size:
        x.reshape(-1)[: hi - lo + 1] = np.arange(lo, hi + 1)
    n = max_n(x0, 1)
    bits = 15
    b, c = np.int64(1 << 20), np.int64(40)
    both("ShiftGELU", x, b, c, np.int8(0), x0=x0, n=n, bits=bits, qmin=-128, qmax=127)


def test_shiftgelu_per_channel_every_axis():
    x = RNG.integers(-3000, 3000, (4, 6, 50), endpoint=True).astype(np.int32)
    for shape in [(50,), (6, 1), (4, 1, 1), (1, 1, 50)]:
        b = RNG.integers(1 << 18, 1 << 22, shape).astype(np.int64)
        c = RNG.integers(30, 45, shape).astype(np.int64)
        both("ShiftGELU", x, b, c, np.uint8(128), x0=300, n=max_n(300, 1), bits=14, qmin=0, qmax=255)


@pytest.mark.parametrize("ti", INT_DTYPES)
@pytest.mark.parametrize("to", INT_DTYPES)
def test_requantize_layouts(ti, to):
    lo, hi = info(ti)
    x = RNG.integers(lo, hi, (3, 5, 7, 40), endpoint=True).astype(ti)
    olo, ohi = info(to)
    for shape in [(), (1,), (40,), (7, 1), (5, 1, 1), (3, 1, 1, 1)]:
        b = RNG.integers(1, 1 << 28, shape).astype(np.int64)
        c = RNG.integers(20, 40, shape).astype(np.int64)
        both("Requantize", x, ti(lo // 3), b, c, np.array(olo // 2, to), qmin=olo, qmax=ohi)


def test_iadd_broadcasts_and_large():
    a = RNG.integers(-128, 127, (8, 197, 192), endpoint=True).astype(np.int8)
    pos = RNG.integers(-128, 127, (1, 197, 192), endpoint=True).astype(np.int8)
    args = (np.int8(3), np.int8(-2), np.int64(3 << 40), np.int64(5 << 39), np.int64(44), np.int8(1))
    both("IAdd", a, pos, *args, qmin=-128, qmax=127)
    both("IAdd", pos, a, *args, qmin=-128, qmax=127)  # the full operand second
    both("IAdd", a, a[::-1].copy(), *args, qmin=-100, qmax=100)


def test_ilayernorm_rows_and_scalar_params():
    x = RNG.integers(-128, 127, (16, 192), endpoint=True).astype(np.int8)
    x[3] = 5  # a constant row: variance 0, clamped to 1
    b = RNG.integers(-(1 << 20), 1 << 20, (192,)).astype(np.int64)
    c = np.full(192, 40, np.int64)
    bias = RNG.integers(-(1 << 45), 1 << 45, (192,)).astype(np.int64)
    both("ILayerNorm", x, b, c, bias, np.int8(0), shift_in=16, p=30, qmin=-128, qmax=127)
    both("ILayerNorm", x, b[:1], c[:1], bias[:1], np.uint8(128), shift_in=10, p=20, qmin=0, qmax=255)


def test_unsupported_calls_fall_back_to_the_reference():
    """A multiplier varying along two axes is outside the native loops: the reference runs, counted."""
    x = RNG.integers(-1000, 1000, (4, 6, 5)).astype(np.int32)
    b = RNG.integers(1, 1 << 20, (6, 5)).astype(np.int64)
    c = np.full((6, 5), 30, np.int64)
    args = (x, np.int32(0), b, c, np.int8(0))
    assert native_kernels.requantize(*args, qmin=-128, qmax=127) is None
    before = native_kernels.STATS["Requantize/numpy"]
    got = native_kernels.run("Requantize", OPS["Requantize"].reference, *args, qmin=-128, qmax=127)
    assert native_kernels.STATS["Requantize/numpy"] == before + 1
    assert np.array_equal(got, OPS["Requantize"].reference(*args, qmin=-128, qmax=127))
    bad_shift = (x, np.int32(0), np.int64(3), np.int64(63), np.int8(0))
    assert native_kernels.requantize(*bad_shift, qmin=-128, qmax=127) is None


# ----------------------------------------------------- the ablation's kernels (IBertGELU, L1LayerNorm)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_ibertgelu_dtypes_and_per_channel_every_axis(dtype):
    lo, hi = info(dtype)
    x = RNG.integers(max(lo, -3000), min(hi, 3000), (4, 6, 50), endpoint=True).astype(dtype)
    clip = 1051 if hi > 3000 else 50
    coeff = clip * clip * 11 // 10
    x.reshape(-1)[:6] = [0, 1, clip - 1, clip, clip + 1, min(hi, 3000)]  # around the clip point
    for shape in [(), (50,), (6, 1), (4, 1, 1), (1, 1, 50)]:
        b = RNG.integers(1 << 18, 1 << 22, shape).astype(np.int64)
        c = RNG.integers(36, 45, shape).astype(np.int64)
        both("IBertGELU", x, b, c, np.uint8(128), clip=clip, coeff=coeff, k=6, qmin=0, qmax=255)
        both("IBertGELU", x, b, c, np.int16(-5), clip=clip, coeff=coeff, k=0, qmin=-32768, qmax=32767)


def test_l1layernorm_rows_and_scalar_params():
    x = RNG.integers(-128, 127, (16, 192), endpoint=True).astype(np.int8)
    x[3] = 5  # a constant row: l1 0, clamped to 1
    x[4] = -128
    x[4, 7] = 127  # one outlier: |d| = l1 / 2
    b = RNG.integers(-(1 << 20), 1 << 20, (192,)).astype(np.int64)
    c = np.full(192, 40, np.int64)
    bias = RNG.integers(-(1 << 45), 1 << 45, (192,)).astype(np.int64)
    both("L1LayerNorm", x, b, c, bias, np.int8(0), shift_in=16, p=30, qmin=-128, qmax=127)
    both("L1LayerNorm", x, b[:1], c[:1], bias[:1], np.uint8(128), shift_in=10, p=20, qmin=0, qmax=255)
    wide = RNG.integers(-(2**31), 2**31 - 1, (3, 4096), endpoint=True).astype(np.int32)
    both("L1LayerNorm", wide, b[:1], c[:1], bias[:1], np.int16(0), shift_in=17, p=61, qmin=-32768, qmax=32767)
