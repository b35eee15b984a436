"""PolyExp (I-BERT's i-exp, Kim et al. 2021, Sec. 3.4), shared by IBertSoftmax and LogIntSoftmax: reference
and body twins.

``poly_exp(d)`` for integer ``d <= 0`` on a grid where ``x0`` steps make ``ln 2`` approximates
``2**n * exp(d * ln2 / x0)``, up to a constant factor (``~ 1 / (A s**2)``, ``s = ln2 / x0``) that every row
normalization cancels::

    a = min(-d, n*x0)                       # clamp: arguments below -n ln2 count as -n ln2
    q = floor(a / x0);  r = a - q*x0        # d s = -q ln2 - r s, 0 <= r < x0
    e = ((qb - r)**2 + qc) * 2**(n - q)     # L(-r s) / (A s**2) * 2**(n - q), L(p) = A (p + B)**2 + C

with I-BERT's ``L(p) = 0.3585 (p + 1.353)**2 + 0.344``: ``qb ~ B / s`` and ``qc ~ C / (A s**2)`` (the
converter rounds them, ``ivit_onnx.qparams.poly_coefficients``). Where I-BERT's released kernel keeps
``floor(L * 2**(n-q))`` in float32, this is exact int64.

Range: for ``1 <= x0 <= qb`` and ``qc >= 0``, ``1 <= qb - r <= qb``, so ``1 <= e <= top * 2**n`` with
``top = qb**2 + qc``, the value at ``d = 0``; a sum of ``L`` terms stays below ``2**61`` when
``L * top * 2**n < 2**61`` (``shift_exp.max_n(top, L)``).
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body

#: the attributes of the exp, shared by both ops (their `bits` and LogIntSoftmax's `log_bits` follow)
POLY_ATTRIBUTES = {
    "x0": "round(ln2/s_x) >= 1: the grid steps in ln 2",
    "qb": "round(1.353 x0/ln2) >= x0: the polynomial's shift",
    "qc": "round(0.344/0.3585 (x0/ln2)**2) >= 0: its constant",
    "n": "exp left shift N",
}


def top(qb: int, qc: int) -> int:
    """``poly_exp(0) / 2**n = qb**2 + qc``: the largest polynomial value, what the overflow bound scales."""
    return int(qb) * int(qb) + int(qc)


def poly_exp(d, x0: int, qb: int, qc: int, n: int) -> np.ndarray:
    """Reference PolyExp of int64 ``d <= 0``."""
    a = np.minimum(-_int.i64(d), np.int64(n * x0))
    q = a // x0
    t = qb - (a - q * x0)
    return (t * t + qc) * _int.pow2(n - q)


def norm_shift(qb: int, qc: int, n: int) -> int:
    """``k = max(n + bits(qb**2 + qc) - 31, 0)``: ``poly_exp >> k`` is below ``2**31`` (IBertSoftmax's
    normalization before its division; ``bits(v)`` is the bit length of ``v``)."""
    return max(n + top(qb, qc).bit_length() - 31, 0)


def row_exps(x, x0: int, qb: int, qc: int, n: int, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(e, sum(e))`` over the last axis, ``e = floor(poly_exp(x - max(x)) / 2**k)``: what both softmaxes
    start with (LogIntSoftmax with ``k = 0``)."""
    x = _int.i64(x)
    e = poly_exp(x - _int.reduce_max(x), x0, qb, qc, n) >> np.int64(k)
    return e, _int.reduce_sum(e)


def poly_exp_body(g: Body, d: str, x0: str, qb: str, qc: str, n: str) -> str:
    """Body twin of :func:`poly_exp`; the parameters are int64 scalar tensors."""
    a = g.minimum(g.op("Neg", d), g.op("Mul", n, x0))
    q = g.op("Div", a, x0)  # a >= 0, x0 > 0: truncation is floor
    t = g.op("Sub", qb, g.op("Sub", a, g.op("Mul", q, x0)))
    return g.op("Mul", g.op("Add", g.op("Mul", t, t), qc), g.pow2(g.op("Sub", n, q)))


def row_exps_body(g: Body, normalized: bool = False) -> tuple[str, str]:
    """Body twin of :func:`row_exps` on the function's input ``x`` and attributes ``x0, qb, qc, n``;
    ``normalized``: ``k = norm_shift(qb, qc, n)``, else 0."""
    x = g.i64("x")
    x0, qb, qc, n = (g.attr_int(k) for k in ("x0", "qb", "qc", "n"))
    e = poly_exp_body(g, g.op("Sub", x, g.reduce_max(x)), x0, qb, qc, n)
    if normalized:  # bits(top) = #{j in 0..62: top >= 2**j}
        powers = g.const([1 << j for j in range(63)])
        length = g.reduce_sum(g.i64(g.op("GreaterOrEqual", g.op("Add", g.op("Mul", qb, qb), qc), powers)))
        k = g.maximum(g.op("Sub", g.op("Add", n, length), g.const(31)), g.const(0))
        e = g.shift_nonneg(e, k)
    return e, g.reduce_sum_exact(e)
