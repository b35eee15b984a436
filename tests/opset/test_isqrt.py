"""ILayerNorm's fixed-step integer Newton square root is exact: ``isqrt(v) == math.isqrt(v)``, ``1..2**62-1``.

Checked for the reference (:func:`ivit_onnx.opset.ilayernorm.isqrt`) and for its function-body twin
in onnxruntime and onnx.reference (the body runs on the same values).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ivit_onnx.opset.ilayernorm import _isqrt_body, isqrt
from tests.opset.oneop import run_body

TOP = 2**62 - 1


def edge_values() -> list[int]:
    """1, 2**62-1, every power of two and its neighbours, and k*k-1, k*k, k*k+1 around them."""
    vals = {1, 2, 3, TOP}
    for e in range(63):
        for v in (2**e - 1, 2**e, 2**e + 1):
            vals.add(v)
    for e in range(32):
        for k in (2**e - 1, 2**e, 2**e + 1, 3 * 2**e // 2 + 1):
            for v in (k * k - 1, k * k, k * k + 1):
                vals.add(v)
    k = math.isqrt(TOP)
    vals.update({k * k - 1, k * k, k * k + 1})
    return sorted(v for v in vals if 1 <= v <= TOP)


def random_values(n: int, seed: int = 0) -> list[int]:
    """Log-uniform values, plus k*k-1 and k*k for random k."""
    rng = np.random.default_rng(seed)
    out = []
    for e in rng.integers(1, 63, n):
        out.append(int(rng.integers(2 ** (int(e) - 1), 2 ** int(e) - 1, endpoint=True)))
    for k in rng.integers(1, math.isqrt(TOP), n // 2, endpoint=True):
        k = int(k)
        out += [k * k - 1, k * k]
    return [min(max(v, 1), TOP) for v in out]


def check(values: list[int]) -> None:
    v = np.array(values, dtype=np.int64)
    want = np.array([math.isqrt(int(x)) for x in values], dtype=np.int64)
    np.testing.assert_array_equal(isqrt(v), want)
    for got in run_body(lambda g, x: _isqrt_body(g, x), {"v": v.reshape(-1, 1)}):
        np.testing.assert_array_equal(got.reshape(-1), want)


def test_isqrt_edges():
    vals = edge_values()
    assert 1 in vals and TOP in vals and (2**31 - 1) ** 2 in vals and (2**31 - 1) ** 2 - 1 in vals
    check(vals)


@pytest.mark.parametrize("seed", [0, 1])
def test_isqrt_random(seed):
    check(random_values(20000, seed))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, TOP), min_size=1, max_size=64))
def test_isqrt_property(values):
    check(values)


def test_isqrt_shapes_and_dtype():
    v = np.array([[1, 4, 15], [16, TOP, 99]], dtype=np.int64)
    r = isqrt(v)
    assert r.dtype == np.int64 and r.shape == v.shape
    np.testing.assert_array_equal(r, [[1, 2, 3], [4, math.isqrt(TOP), 9]])
