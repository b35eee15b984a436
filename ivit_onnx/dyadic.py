"""Dyadic numbers: every real rescale factor becomes ``b / 2**c`` with integers ``b``, ``c``.

Computed once at rewrite time (I-ViT Sec. 3.2). ``b`` is normalised to the widest magnitude that keeps
``|x * b| + 2**(c-1) < 2**63`` for the stated input bound, so the product fits the int64 accumulator
every opset kernel uses, and the relative error of ``b / 2**c`` is at most ``2**-(bits-1)``.
"""

from __future__ import annotations

import math

import numpy as np

#: largest shift any kernel accepts: ``2**c`` must be an int64 and ``x*b + 2**(c-1)`` must not overflow.
MAX_SHIFT = 62
#: widest multiplier magnitude (31-bit, as the released I-ViT requantizer).
MAX_BITS = 31


class DyadicError(ValueError):
    """A scale or multiplier that has no valid dyadic form (zero, negative, NaN, inf, out of range)."""


def multiplier_bits(max_abs_input: int, accumulator_bits: int = 61) -> int:
    """Bits of the widest ``b`` with ``max_abs_input * |b| < 2**accumulator_bits``."""
    if max_abs_input < 0:
        raise DyadicError(f"input bound must be non-negative, got {max_abs_input}")
    in_bits = int(max_abs_input).bit_length()
    bits = min(MAX_BITS, accumulator_bits - in_bits)
    if bits < 8:
        raise DyadicError(f"input bound {max_abs_input} leaves only {bits} bits for the multiplier")
    return bits


def _check_real(m: float, what: str, allow_negative: bool) -> float:
    m = float(m)
    if not math.isfinite(m):
        raise DyadicError(f"{what} is {m}: scales must be finite")
    if m == 0.0:
        raise DyadicError(f"{what} is 0: a zero scale cannot be requantized")
    if m < 0 and not allow_negative:
        raise DyadicError(f"{what} is {m}: scales must be positive")
    return m


def dyadic(
    m: float, bits: int = MAX_BITS, *, what: str = "multiplier", allow_negative: bool = False
) -> tuple[int, int]:
    """Return ``(b, c)`` with ``b / 2**c ~= m``, ``2**(bits-1) <= |b| < 2**bits`` and ``0 <= c <= 62``.

    Where ``m`` is so small that ``c`` would pass 62, ``b`` loses leading bits (the error stays below
    ``2**-62`` in absolute terms); ``m >= 2**bits`` has no representation and raises.
    """
    m = _check_real(m, what, allow_negative)
    if not 1 <= bits <= MAX_BITS:
        raise DyadicError(f"multiplier width must be 1..{MAX_BITS} bits, got {bits}")
    mag = abs(m)
    frac, exp = math.frexp(mag)  # mag = frac * 2**exp, 0.5 <= frac < 1
    c = bits - exp
    if c < 0:
        raise DyadicError(f"{what} {m:g} is too large for a {bits}-bit dyadic multiplier (max 2**{bits})")
    c = min(c, MAX_SHIFT)
    b = round(math.ldexp(mag, c))
    if b >= 1 << bits:  # rounding carried into a new bit
        b >>= 1
        c -= 1
        if c < 0:
            raise DyadicError(f"{what} {m:g} is too large for a {bits}-bit dyadic multiplier")
    if b == 0:
        raise DyadicError(f"{what} {m:g} is below 2**-{MAX_SHIFT + 1}: it rounds to zero")
    return (-b if m < 0 else b), c


def dyadic_array(
    m: np.ndarray, bits: int = MAX_BITS, *, what: str = "multiplier", allow_negative: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise :func:`dyadic` (vectorized) for per-channel multipliers; int64 arrays shaped like ``m``."""
    arr = np.asarray(m, dtype=np.float64)
    flat = arr.reshape(-1)
    bad = ~np.isfinite(flat) | (flat == 0) | ((flat < 0) & (not allow_negative))
    if np.any(bad) or not 1 <= bits <= MAX_BITS:
        i = int(np.argmax(bad)) if np.any(bad) else 0
        dyadic(float(flat[i]), bits, what=f"{what}[{i}]", allow_negative=allow_negative)  # raises the message
    mag = np.abs(flat)
    _, exp = np.frexp(mag)
    c = bits - exp.astype(np.int64)
    if np.any(c < 0):
        i = int(np.argmax(c < 0))
        dyadic(float(flat[i]), bits, what=f"{what}[{i}]", allow_negative=allow_negative)
    c = np.minimum(c, MAX_SHIFT)
    b = np.rint(np.ldexp(mag, c))
    carry = b >= 2.0**bits
    b = np.where(carry, np.rint(b / 2), b)
    c = np.where(carry, c - 1, c)
    if np.any(c < 0) or np.any(b == 0):
        i = int(np.argmax((c < 0) | (b == 0)))
        dyadic(float(flat[i]), bits, what=f"{what}[{i}]", allow_negative=allow_negative)
    b = (np.sign(flat) * b).astype(np.int64)
    return b.reshape(arr.shape), c.astype(np.int64).reshape(arr.shape)


def dyadic_value(b, c) -> np.ndarray:
    """The real value ``b / 2**c`` (float64) of a dyadic pair, for reports and error checks."""
    return np.ldexp(np.asarray(b, dtype=np.float64), -np.asarray(c, dtype=np.int64))


def relative_error(m, b, c) -> float:
    """Largest ``|b/2**c - m| / |m|`` over the elements."""
    m = np.asarray(m, dtype=np.float64)
    return float(np.max(np.abs(dyadic_value(b, c) - m) / np.abs(m)))
