"""IL2Norm: integer L2 normalization over the last axis, ``F.normalize(x, dim=-1)`` (cosine attention).

I-ViT's ILayerNorm without the centring: the input's zero point is removed instead of the mean, and the norm
is clamped below by ``eps`` as ``x / max(||x||, eps)`` clamps it. For integer ``x`` (rows of ``C``)::

    d = (x - zx) * 2**shift_in
    v = max(sum(d*d), 1)
    r = max(isqrt(v), eps)    # ILayerNorm's exact integer sqrt; eps in units of d (>= 1)
    u = floor(d * floor(2**61 / r) / 2**(61 - p))   # ~ x / max(||x||, eps) * 2**p, |u| <= 2**p
    y = clip(floor((u*b + floor(2**c/2)) / 2**c) + zy, qmin, qmax)

The converter sets ``b/2**c ~ 1/(2**p s_y)`` and ``eps = max(1, ceil(eps_real * 2**shift_in / s_x))``, so a
row whose norm lies below ``eps_real`` is divided by ``eps_real`` (rounded up to the grid of ``d``), and an
all-zero row gives ``u = 0``. ``|d| <= isqrt(v) <= r`` (``d**2 <= v``, ``d`` an integer), so
``|d * floor(2**61/r)| <= 2**61`` and ``|u| <= 2**p``. Preconditions: ``C * max|d|**2 < 2**62`` (choose
``shift_in``; then ``sum(d*d) < 2**62`` too), ``1 <= eps < 2**62``, ``0 <= p <= 61``, ``zx`` a scalar,
``2**p * |b| + 2**(c-1) < 2**62``, ``0 <= c <= 62``.
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body
from ._spec import INT_IN, Port, dyadic, requantizing
from .ilayernorm import _isqrt_body, isqrt, normalized, normalized_body


def offset(x, x_zero_point, shift_in: int) -> np.ndarray:
    """``(x - zx) * 2**shift_in``: the row the norm is taken of."""
    return (_int.i64(x) - _int.i64(x_zero_point)) * (1 << shift_in)


def reference(x, x_zero_point, multiplier, shift, y_zero_point, *, shift_in: int, eps: int, p: int, qmin: int,
              qmax: int):
    d = offset(x, x_zero_point, shift_in)
    r = np.maximum(isqrt(np.maximum(_int.reduce_sum(d * d), 1)), np.int64(eps))
    u = normalized(d, r, p)
    y = _int.round_shift(u * _int.i64(multiplier), shift) + _int.i64(y_zero_point)
    return _int.saturate(y, qmin, qmax, y_zero_point.dtype)


def body(g: Body) -> None:
    d = g.op("Mul", g.op("Sub", g.i64("x"), g.i64("x_zero_point")), g.pow2(g.attr_int("shift_in")))
    v = g.maximum(g.reduce_sum_exact(g.op("Mul", d, d)), g.const(1))
    u = normalized_body(g, d, lambda: g.maximum(_isqrt_body(g, v), g.attr_int("eps")))
    g.requantize_out(g.op("Mul", u, "multiplier"))


SPEC = requantizing(
    "IL2Norm", __doc__, reference, body, "x / max(||x||_2, eps), requantized",
    Port("x", INT_IN, "input rows (int8/int16, or int32 within the precondition)"),
    Port("x_zero_point", INT_IN, "input zero point (scalar)"),
    *dyadic("b (per tensor or per channel), b/2**c ~ 1/(2**p s_y)", "c, 0..62"),
    shift_in="x - zx scaled by 2**shift_in before the norm",
    eps="lower clamp of the integer norm, in units of d (>= 1)",
    p="fraction bits of the normalized value",
)
