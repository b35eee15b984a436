"""The function bodies stay exact where the engines are not.

onnxruntime 1.31 (CPU, AVX-512) gets int64 ``Max``/``Min``/``Clip``/``ReduceMax`` wrong for values with
``2**31 <= |v| < 2**32`` in tensors of more than one element, and sums int64 ``ReduceSum`` in double
(exact only below ``2**53``). The bodies avoid both (:class:`ivit_onnx.opset._body.Body`); these tests
feed each op inputs whose intermediates land exactly there, in several tensor shapes (the engines
take different code paths for scalars, short and long tensors), so a body that regresses fails here
even when random inputs would miss it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ivit_onnx.opset import OPS
from ivit_onnx.opset.ilayernorm import isqrt
from ivit_onnx.opset.shift_exp import shift_exp
from tests.opset.oneop import OPSETS, check_all_ways, iadd_params, requantize_params, run_body

LEADING = [(), (2,), (8,), (3, 5)]


def tile(row, lead, dtype) -> np.ndarray:
    row = np.asarray(row, dtype=np.int64)
    return np.ascontiguousarray(np.broadcast_to(row, tuple(lead) + row.shape)).astype(dtype)


# -------------------------------------------------------------------------------- Body primitives

BAND = np.array([2**31, 2**31 + 1, 3 * 2**30, 2**32 - 1, -(2**31) - 1, -(2**32), -3 * 2**30], np.int64)


@pytest.mark.parametrize("shape", [(1,), (2,), (7,), (8,), (2, 1), (3, 17)])
@pytest.mark.parametrize("other", ["scalar", "small", "band"])
def test_maximum_minimum_in_the_int32_band(shape, other):
    rng = np.random.default_rng(len(shape) * 10 + shape[-1])
    a = rng.choice(BAND, shape)
    b = {"scalar": np.array(-128, np.int64), "small": rng.integers(-5, 5, shape, endpoint=True),
         "band": rng.choice(BAND, shape)}[other].astype(np.int64)
    for got in run_body(lambda g, x, y: g.maximum(x, y), {"a": a, "b": b}):
        np.testing.assert_array_equal(got, np.maximum(a, b))
    for got in run_body(lambda g, x, y: g.minimum(x, y), {"a": a, "b": b}):
        np.testing.assert_array_equal(got, np.minimum(a, b))


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("row", [2, 4, 64, 4096])
def test_reduce_sum_exact_beyond_2_53(opset, row):
    rng = np.random.default_rng(row)
    x = np.ones((3, row), np.int64)
    x[0, 0] = 2**53  # onnxruntime's double sum would round 2**53 + (row-1)
    x[1] = rng.integers(0, 2**62 // row, row)  # sums up to 2**62 with odd terms
    x[2] = 2**62 // row - 1
    for got in run_body(lambda g, v: g.reduce_sum_exact(v), {"x": x}, opset):
        np.testing.assert_array_equal(got, x.sum(-1, keepdims=True))


# --------------------------------------------------------------------------------- op level


@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("opset", OPSETS)
def test_requantize_saturates_from_the_band(lead, opset):
    # (x - zx) * 1.5 lands in 2**31..2**32: the Clip would let it through and the cast would wrap
    x = tile([2**31 - 1, -(2**31), 2**30 + 12345, -(2**30) - 999, 0, 7], lead, np.int32)
    b, c = requantize_params(1.5, 1.0, 2**31)
    check_all_ways(OPS["Requantize"], [x, np.int32(0), b, c, np.int8(3)], {"qmin": -128, "qmax": 127}, opset)
    y = check_all_ways(OPS["Requantize"], [x, np.int32(0), b, c, np.int32(0)],
                       {"qmin": -(2**31), "qmax": 2**31 - 1}, opset)
    assert y.reshape(-1, 6)[0, 0] == 2**31 - 1 and y.reshape(-1, 6)[0, 1] == -(2**31)


@pytest.mark.parametrize("lead", LEADING)
def test_iadd_saturates_from_the_band(lead):
    a = tile([2**31 - 1, -(2**31), 2**31 - 1, 5], lead, np.int32)
    b = tile([2**30, -(2**30), -(2**31), 5], lead, np.int32)
    ma, mb, c = iadd_params(1.0, 1.0, 1.0, 2**31, 2**31)
    check_all_ways(OPS["IAdd"], [a, b, np.int32(0), np.int32(0), ma, mb, c, np.int16(0)],
                   {"qmin": -32768, "qmax": 32767})


@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("n", [0, 15, 30])
def test_shift_exp_clamp_from_the_band(lead, n):
    # d = x - max reaches -2**32: p ~ 1.44 d is far below -n*x0, and in the band for some elements
    x = tile([2**31 - 1, -(2**31), -(2**31) + 3 * 2**29, 0, -(2**30), 2**30], lead, np.int32)
    check_all_ways(OPS["Shiftmax"], [x, np.int16(0)], {"x0": 3, "n": n, "bits": 15}, opset=OPSETS[n % 2])
    check_all_ways(OPS["ShiftGELU"], [x, np.int64(1), np.int64(20), np.int32(0)],
                   {"x0": 3, "n": n, "bits": 8, "qmin": -(2**31), "qmax": 2**31 - 1})


def shiftmax_row_summing_to(total: int, n: int) -> np.ndarray:
    """A row of ``d <= 0`` whose shift-exps (``x0 = 1``) sum to exactly ``total`` (``2**n <= total``)."""
    reach = {}  # -p -> d, for the p that d reaches
    for d in range(0, -4 * n, -1):
        p = max(d + d // 2 - d // 16, -n)
        reach.setdefault(-p, d)
    rest, row = total - 2**n, [0]
    for j in sorted(reach)[1:]:
        while rest >= 2 ** (n - j):
            row.append(reach[j])
            rest -= 2 ** (n - j)
    assert rest == 0
    row = np.array(row, np.int64)
    assert int(shift_exp(row, 1, n).sum()) == total
    return row


@pytest.mark.parametrize("lead", LEADING)
def test_shiftmax_sum_beyond_2_53(lead):
    # sum(e) = floor((2**62-1)/65) + a double rounding of it moves floor((2**62-1)/sum) from 65 to 64
    n = 55
    row = shiftmax_row_summing_to((2**62 - 1) // 65, n)
    assert len(row) * 2**n < 2**62
    x = tile(row, lead, np.int8)
    y = check_all_ways(OPS["Shiftmax"], [x, np.int8(-128)], {"x0": 1, "n": n, "bits": 8})
    assert y.reshape(-1, len(row))[0, 0] == -128 + 2**n * 65 // 2 ** (62 - 8)


def ilayernorm_unit(x, p: int, c: int, opset: int = 17) -> np.ndarray:
    """ILayerNorm with ``b = 1``, no bias, ``shift_in = 0``, int32 output."""
    ch = x.shape[-1]
    params = [np.ones(ch, np.int64), np.full(ch, c, np.int64), np.zeros(ch, np.int64), np.int32(0)]
    return check_all_ways(OPS["ILayerNorm"], [x, *params],
                          {"shift_in": 0, "p": p, "qmin": -(2**31), "qmax": 2**31 - 1}, opset)


def unit_output(d: int, r: int, p: int, c: int) -> int:
    """What :func:`ilayernorm_unit` gives for an element ``d`` of a row with ``isqrt(v) = r`` (exact ints)."""
    u = (d * (2**61 // r)) >> (61 - p)
    return (u + (1 << c) // 2) >> c


@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("opset", OPSETS)
def test_ilayernorm_variance_in_the_band(lead, opset):
    # v = 2 * 40000**2 = 3.2e9 lies in 2**31..2**32: max(v, 1) must not pick 1
    y = ilayernorm_unit(tile([0, 80000], lead, np.int32), 30, 0, opset)
    assert int(y.reshape(-1, 2)[0, 1]) == unit_output(40000, math.isqrt(2 * 40000**2), 30, 0)


@pytest.mark.parametrize("lead", LEADING)
def test_ilayernorm_isqrt_starts_in_the_band(lead):
    # v = 2**61 has 62 bits: Newton starts at r = 2**31 and min(r, next) must not keep it
    y = ilayernorm_unit(tile([-(2**30), 2**30], lead, np.int32), 40, 20)
    assert int(y.reshape(-1, 2)[0, 1]) == unit_output(2**30, math.isqrt(2**61), 40, 20)


@pytest.mark.parametrize("lead", LEADING)
def test_ilayernorm_sum_of_squares_beyond_2_53(lead):
    # v = k*k - 5 (k = 486602137): a double rounding to >= k*k would make isqrt(v) = k, not k - 1
    k = 486602137
    d = np.array([344079669, -344079669, 27814, -27814, 21765, -21765], np.int64)
    assert int((d * d).sum()) == k * k - 5 and isqrt(np.int64(k * k - 5)) == k - 1
    assert unit_output(344079669, k - 1, 61, 30) != unit_output(344079669, k, 61, 30)
    y = ilayernorm_unit(tile(d + 7, lead, np.int32), 61, 30)
    assert int(y.reshape(-1, 6)[0, 0]) == unit_output(344079669, k - 1, 61, 30)
