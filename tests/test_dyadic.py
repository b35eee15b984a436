"""Dyadic folding of real multipliers: ``b / 2**c`` precision, int64 headroom, errors, per-channel arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ivit_onnx.dyadic import (
    MAX_BITS,
    MAX_SHIFT,
    DyadicError,
    dyadic,
    dyadic_array,
    dyadic_value,
    multiplier_bits,
    relative_error,
)


def log_uniform(n: int, lo: float, hi: float, seed: int = 0) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).uniform(math.log(lo), math.log(hi), n))


multipliers = st.floats(math.log(1e-9), math.log(1e3)).map(math.exp)
bounds = st.integers(0, 2**51 - 1)  # leaves >= 11 bits: room for multipliers up to 1e3


# ----------------------------------------------------------------------------------------- precision


def test_default_is_31_bits():
    assert MAX_BITS == 31 and MAX_SHIFT == 62
    b, c = dyadic(0.3)
    assert 2**30 <= b < 2**31 and 0 <= c <= MAX_SHIFT


def test_relative_error_log_uniform_1e_9_to_1e3():
    ms = log_uniform(20000, 1e-9, 1e3)
    for m in ms:
        b, c = dyadic(float(m))
        assert 2**30 <= b < 2**31 and 0 <= c <= MAX_SHIFT
        assert abs(b / 2**c - m) <= 2.0**-30 * m  # exact: b / 2**c is a float64 here
    b, c = dyadic_array(ms)
    assert relative_error(ms, b, c) <= 2.0**-30


@settings(max_examples=300, deadline=None)
@given(m=multipliers, bits=st.integers(11, MAX_BITS))
def test_relative_error_for_any_width(m, bits):
    b, c = dyadic(m, bits)
    assert 2 ** (bits - 1) <= b < 2**bits
    # |b - m 2**c| <= 1/2 with b >= 2**(bits-1): relative error <= 2**-bits
    assert abs(b - math.ldexp(m, c)) <= 0.5
    assert relative_error(m, b, c) <= 2.0**-bits


@pytest.mark.parametrize("k", [-20, -1, 0, 1, 10, 29])
def test_rounding_carry_into_a_new_bit(k):
    # just below a power of two: b rounds up to 2**31 and must be renormalised to 2**30, c - 1
    m = math.ldexp(1 - 2.0**-40, k)
    b, c = dyadic(m)
    assert b == 2**30 and b / 2**c == 2.0**k
    assert dyadic_array(np.array([m])) == (np.array([b]), np.array([c]))


def test_tiny_multipliers_keep_absolute_precision():
    # below 2**-32 the shift is capped at 62 and b narrows: absolute error <= 2**-63
    for m in (1e-10, 2.0**-40, 1e-15, 3e-18):
        b, c = dyadic(m)
        assert c == MAX_SHIFT and 1 <= b < 2**31
        assert abs(b / 2**c - m) <= 2.0**-63


def test_negative_multipliers_when_allowed():
    b, c = dyadic(-0.75, allow_negative=True)
    assert b == -(3 * 2**29) and c == 31
    bs, cs = dyadic_array(np.array([-0.75, 0.75]), allow_negative=True)
    assert bs.tolist() == [-(3 * 2**29), 3 * 2**29] and cs.tolist() == [31, 31]


# ----------------------------------------------------------------------------------------- headroom


@settings(max_examples=300, deadline=None)
@given(m=multipliers, bound=bounds)
def test_product_never_overflows_int64(m, bound):
    bits = multiplier_bits(bound)
    assert 10 <= bits <= MAX_BITS
    b, c = dyadic(m, bits)
    # the requantize precondition (|t| < 2**62, what the bodies' biased shift needs), in exact integers
    assert bound * abs(b) + (1 << c) // 2 < 2**62
    # and numpy's int64 product of the extreme input with b does not wrap
    x = np.array([bound, -bound], dtype=np.int64)
    prod = x * np.int64(b) + (np.int64(1) << np.int64(c)) // 2
    assert prod.tolist() == [bound * b + (1 << c) // 2, -bound * b + (1 << c) // 2]


@pytest.mark.parametrize("bound,bits", [(0, 31), (1, 31), (2**30 - 1, 31), (2**30, 30), (2**31, 29),
                                        (2**46, 14), (2**52, 8)])
def test_multiplier_bits(bound, bits):
    assert multiplier_bits(bound) == bits
    assert bound * (2**bits - 1) < 2**61


@pytest.mark.parametrize("bound", [2**54, 2**60, 2**63])
def test_multiplier_bits_too_wide_an_input(bound):
    with pytest.raises(DyadicError, match=f"input bound {bound} leaves only"):
        multiplier_bits(bound)


def test_multiplier_bits_negative_bound():
    with pytest.raises(DyadicError, match="non-negative"):
        multiplier_bits(-1)


# ----------------------------------------------------------------------------------------- bad scales


@pytest.mark.parametrize("m,message", [
    (0.0, "is 0: a zero scale"),
    (-0.0, "is 0: a zero scale"),
    (-0.5, "must be positive"),
    (float("nan"), "must be finite"),
    (float("inf"), "must be finite"),
    (float("-inf"), "must be finite"),
    (2.0**31, "too large for a 31-bit"),
    (1e12, "too large for a 31-bit"),
    (2.0**31 - 2.0**-30, "too large for a 31-bit"),  # rounds up to 2**31
    (1e-20, "rounds to zero"),
])
def test_bad_scales_raise(m, message):
    with pytest.raises(DyadicError, match=message) as err:
        dyadic(m, what="scale of x")
    assert "scale of x" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_bad_width_raises():
    for bits in (0, 32, -1):
        with pytest.raises(DyadicError, match="width must be 1..31"):
            dyadic(0.5, bits)


def test_too_large_for_a_narrow_width():
    with pytest.raises(DyadicError, match="too large for a 8-bit"):
        dyadic(300.0, 8)
    assert dyadic(255.0, 8) == (255, 0)


@pytest.mark.parametrize("bad,message", [(0.0, "is 0"), (-1.0, "must be positive"), (np.nan, "finite"),
                                         (np.inf, "finite"), (1e12, "too large"), (1e-20, "rounds to zero")])
def test_dyadic_array_names_the_bad_channel(bad, message):
    m = np.array([0.5, 0.25, bad, 0.125])
    with pytest.raises(DyadicError, match=message) as err:
        dyadic_array(m, what="w_scale")
    assert "w_scale[2]" in str(err.value)


# ----------------------------------------------------------------------------------------- per channel


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 4), (2, 1, 5)])
@pytest.mark.parametrize("bits", [31, 24, 12])
def test_dyadic_array_matches_scalar(shape, bits):
    rng = np.random.default_rng(bits)
    m = np.exp(rng.uniform(math.log(1e-9), math.log(min(1e3, 2.0**bits / 2)), shape))
    m.reshape(-1)[0] = math.ldexp(1 - 2.0**-40, 3)  # a carry
    b, c = dyadic_array(m, bits)
    assert b.shape == c.shape == shape and b.dtype == c.dtype == np.int64
    for i in np.ndindex(shape):
        assert (int(b[i]), int(c[i])) == dyadic(float(m[i]), bits)
    assert relative_error(m, b, c) <= 2.0**-bits


def test_dyadic_array_scalar_and_value():
    b, c = dyadic_array(0.5)
    assert b.shape == () and (int(b), int(c)) == dyadic(0.5)
    np.testing.assert_array_equal(dyadic_value(np.array([3, -3]), np.array([1, 2])), [1.5, -0.75])


@settings(max_examples=200, deadline=None)
@given(st.lists(multipliers, min_size=1, max_size=32), st.integers(11, MAX_BITS))
def test_dyadic_array_property(ms, bits):
    m = np.array(ms)
    b, c = dyadic_array(m, bits)
    assert [(int(x), int(y)) for x, y in zip(b, c, strict=True)] == [dyadic(v, bits) for v in ms]
