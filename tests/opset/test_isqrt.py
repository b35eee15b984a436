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

from ivit_onnx.opset.ilayernorm import SQRT_STEPS, _isqrt_body, isqrt
from tests.opset import released_ivit as released
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


# ---------------------------------------------- against I-BERT's i-sqrt (Alg. 4) and I-ViT's released one


def ibert_isqrt(n: int) -> tuple[int, int]:
    """I-BERT's Alg. 4 (Kim et al. 2021), ``(root, iterations)``: ``x_0 = 2**ceil(Bits(n)/2)``,
    ``x_{i+1} = floor((x_i + floor(n / x_i)) / 2)``, returning ``x_i`` at the first ``x_{i+1} >= x_i``."""
    x, i = 1 << ((n.bit_length() + 1) // 2), 0
    while True:
        nxt, i = (x + n // x) // 2, i + 1
        if nxt >= x:
            return x, i
        x = nxt


def test_isqrt_is_ibert_algorithm_4_with_a_sufficient_step_count():
    """Ours starts where Alg. 4 starts and ``min`` freezes it where Alg. 4 stops, so the two agree wherever
    Alg. 4 stops within SQRT_STEPS iterations: it needs at most 7 on these values (6 from a start within 2x
    above the root, and the one that sees the fixed point). Both are exact."""
    vals = edge_values() + random_values(5000, seed=2)
    got = isqrt(np.array(vals, dtype=np.int64))
    roots, steps = zip(*(ibert_isqrt(v) for v in vals), strict=True)
    assert max(steps) == 7 <= SQRT_STEPS
    np.testing.assert_array_equal(got, np.array(roots, np.int64))
    np.testing.assert_array_equal(got, [math.isqrt(v) for v in vals])


def test_released_ivit_isqrt_is_not_exact():
    """I-ViT's released IntLayerNorm starts at 2**16 for 10 fixed steps (``released_ivit.isqrt``): it does not
    reach the root of small or large variances and can end one above it (``k*k - 1`` oscillates between
    ``k - 1`` and ``k``); ours is exact on all of these."""
    vals = np.array([1, 2**10, 2**14, 2**50, 2**62 - 1, 1100 * 1100 - 1], dtype=np.int64)
    want = np.array([math.isqrt(int(v)) for v in vals], dtype=np.int64)
    assert np.all(released.isqrt(vals) != want)
    np.testing.assert_array_equal(isqrt(vals), want)
    band = np.array(random_values(2000, seed=3), dtype=np.int64)
    band = band[(band >= 2**20) & (band < 2**44)]  # where 10 steps from 2**16 do converge
    assert np.mean(released.isqrt(band) == [math.isqrt(int(v)) for v in band]) > 0.9
