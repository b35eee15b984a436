"""ILayerNorm (I-ViT Sec. 3.5): integer LayerNorm over the last axis, integer sqrt, gamma/beta folded.

For integer ``x`` (rows of ``C``)::

    d = x * 2**shift_in - floor(sum(x) * 2**shift_in / C)   # centred on the mean to 2**-shift_in
    v = max(sum(d*d), 1)
    r = isqrt(v)              # Newton from 2**ceil(bits(v)/2), 10 steps, r <- min(r, (r + v//r)//2): exact
    u = floor(d * floor(2**61 / r) / 2**(61 - p))   # ~ (x - mean)/std / sqrt(C) * 2**p, |u| <= 2**p
    y = clip(floor((u*b + bias + floor(2**c/2)) / 2**c) + zy, qmin, qmax)

The converter folds ``b/2**c ~ sqrt(C)*gamma/(2**p * s_y)`` (per channel, signed) and
``bias ~ beta/s_y * 2**c``. Preconditions: ``C * max|d|**2 < 2**62`` (choose ``shift_in``),
``2**p * |b| + |bias| + 2**(c-1) < 2**62``, ``0 <= p <= 61``
(``|d| <= r`` so ``|d * floor(2**61/r)| <= 2**61``).
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body
from ._spec import I64, INT_IN, Port, dyadic, requantizing

#: Newton steps; from a start within 2x above the root, 6 suffice for 62-bit values.
SQRT_STEPS = 10
_POW2 = [1 << k for k in range(63)]


def isqrt(v) -> np.ndarray:
    """Exact ``floor(sqrt(v))`` for int64 ``1 <= v < 2**62`` by the fixed-step integer Newton iteration."""
    v = _int.i64(v)
    nbits = np.sum(v[..., None] >= np.array(_POW2, dtype=np.int64), axis=-1)
    r = _int.pow2((nbits + 1) // 2)
    for _ in range(SQRT_STEPS):
        r = np.minimum(r, (r + v // r) // 2)
    return r


def centred(x, shift_in: int) -> np.ndarray:
    """``x * 2**shift_in - floor(sum(x) * 2**shift_in / C)`` over rows of ``C`` (shared with L1LayerNorm)."""
    x = _int.i64(x)
    return x * (1 << shift_in) - _int.floor_div(_int.reduce_sum(x) * (1 << shift_in), x.shape[-1])


def normalized(d, norm, p: int) -> np.ndarray:
    """``floor(d * floor(2**61 / norm) / 2**(61 - p))`` for ``|d| <= norm`` (shared with L1LayerNorm)."""
    return _int.floor_div(d * ((1 << 61) // norm), 1 << (61 - p))


def reference(x, multiplier, shift, bias, y_zero_point, *, shift_in: int, p: int, qmin: int, qmax: int):
    d = centred(x, shift_in)
    u = normalized(d, isqrt(np.maximum(_int.reduce_sum(d * d), 1)), p)
    t = u * _int.i64(multiplier) + _int.i64(bias)
    y = _int.round_shift(t, shift) + _int.i64(y_zero_point)
    return _int.saturate(y, qmin, qmax, y_zero_point.dtype)


def _isqrt_body(g: Body, v: str) -> str:
    nbits = g.reduce_sum(g.i64(g.op("GreaterOrEqual", g.op("Unsqueeze", v, g.const([-1])), g.const(_POW2))))
    r = g.pow2(g.op("Div", g.op("Add", g.op("Squeeze", nbits, g.const([-1])), g.const(1)), g.const(2)))
    two = g.const(2)
    for _ in range(SQRT_STEPS):
        r = g.minimum(r, g.op("Div", g.op("Add", r, g.op("Div", v, r)), two))
    return r


def centred_body(g: Body) -> str:
    """Body twin of :func:`centred` on the input ``x`` and attribute ``shift_in``."""
    x = g.i64("x")
    c_len = g.op("Gather", g.op("Shape", x), g.const(-1))
    scale_in = g.pow2(g.attr_int("shift_in"))
    mean = g.floor_div(g.op("Mul", g.reduce_sum(x), scale_in), c_len)
    return g.op("Sub", g.op("Mul", x, scale_in), mean)


def normalized_body(g: Body, d: str, norm) -> str:
    """Body twin of :func:`normalized` with attribute ``p``; ``norm()`` builds the norm (``>= 1``: truncating
    Div is floor) after the dividend's constant, the node order ILayerNorm's body has always had."""
    f = g.op("Div", g.const(1 << 61), norm())
    return g.floor_shift(g.op("Mul", d, f), g.op("Sub", g.const(61), g.attr_int("p")))


def body(g: Body) -> None:
    d = centred_body(g)
    v = g.maximum(g.reduce_sum_exact(g.op("Mul", d, d)), g.const(1))
    u = normalized_body(g, d, lambda: _isqrt_body(g, v))
    t = g.op("Add", g.op("Mul", u, "multiplier"), "bias")
    g.requantize_out(t)


SPEC = requantizing(
    "ILayerNorm", __doc__, reference, body, "LayerNorm(x), requantized",
    Port("x", INT_IN, "input rows (int8/int16, or int32 within the precondition)"),
    *dyadic("b per channel (signed: gamma's sign)", "c per channel, 0..62"),
    Port("bias", I64, "beta/s_y * 2**c per channel"),
    shift_in="x and its mean scaled by 2**shift_in before centring",
    p="fraction bits of the normalized value",
)
