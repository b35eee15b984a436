"""ShiftExp and IntDiv (I-ViT Alg. 1), shared by Shiftmax and ShiftGELU: reference and body twins.

``shift_exp(d)`` for integer ``d <= 0`` on the grid ``1/x0`` approximates ``2**n * x0 * e**(d/x0)``::

    p = d + floor(d/2) - floor(d/16)        # d * log2(e), log2(e) ~ 1.0111b
    p = max(p, -n*x0)                       # so q <= n and the left shift below is >= 0
    q = floor(-p / x0);  r = -p - q*x0      # 2**(p/x0) = 2**-q * 2**(-r/x0), 0 <= r < x0
    e = (x0 + floor(-r/2)) * 2**(n - q)     # 2**(-r/x0) ~ 1 - r/(2 x0)  (linear, Eq. 8)

Range: ``1 <= e <= x0 * 2**n`` (``x0 + floor(-r/2) >= 1`` for ``x0 >= 1``), so a sum of ``L`` terms
stays below ``2**62`` when ``L * x0 * 2**n < 2**62`` -- the precondition :func:`max_n` enforces.

``int_div(e, s, bits) = floor(e * floor((2**62-1) / s) / 2**(62-bits))`` approximates
``e / s * 2**bits``; for ``0 <= e <= s`` the product is at most ``2**62-1``, so it never overflows
int64 and the result lies in ``[0, 2**bits - 1]``.
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body


def max_n(x0: int, row: int, cap: int = 30) -> int:
    """Largest ``n <= cap`` with ``2 * row * x0 * 2**n < 2**62`` (sums of ``row`` exps, with headroom x2)."""
    if x0 < 1 or row < 1:
        raise ValueError(f"x0 and row length must be >= 1 (x0={x0}, row={row})")
    n = 61 - (int(row) * int(x0)).bit_length()
    if n < 0:
        raise ValueError(f"x0={x0} with rows of {row} leaves no room for the exp shift")
    return min(n, cap)


def shift_exp(d, x0: int, n: int) -> np.ndarray:
    """Reference ShiftExp of int64 ``d <= 0``."""
    d = _int.i64(d)
    p = d + _int.floor_div(d, 2) - _int.floor_div(d, 16)
    p = np.maximum(p, -n * x0)
    q = (-p) // x0
    r = -p - q * x0
    return (x0 + _int.floor_div(-r, 2)) * _int.pow2(n - q)


def int_div(e, s, bits: int) -> np.ndarray:
    """Reference IntDiv: ``e / s`` with ``bits`` fractional bits, for ``0 <= e <= s``."""
    f = np.int64(_int.RECIP_M) // _int.i64(s)
    return (_int.i64(e) * f) >> (62 - bits)


def shift_exp_body(g: Body, d: str, x0: str, n: str) -> str:
    """Body twin of :func:`shift_exp`; ``x0`` and ``n`` are int64 scalar tensors."""
    one, four = g.const(1), g.const(4)
    p = g.op("Sub", g.op("Add", d, g.floor_shift(d, one)), g.floor_shift(d, four))
    p = g.maximum(p, g.op("Neg", g.op("Mul", n, x0)))
    neg_p = g.op("Neg", p)
    q = g.op("Div", neg_p, x0)  # neg_p >= 0, x0 > 0: truncation is floor
    r = g.op("Sub", neg_p, g.op("Mul", q, x0))
    base = g.op("Add", x0, g.floor_shift(g.op("Neg", r), one))
    return g.op("Mul", base, g.pow2(g.op("Sub", n, q)))


def int_div_body(g: Body, e: str, s: str, bits: str) -> str:
    """Body twin of :func:`int_div` (both operands non-negative: truncating Div is floor)."""
    f = g.op("Div", g.const(_int.RECIP_M), s)
    return g.shift_nonneg(g.op("Mul", e, f), g.op("Sub", g.const(62), bits))
