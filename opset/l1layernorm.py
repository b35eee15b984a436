"""L1LayerNorm (Fully-8bit, Lin et al. 2020): LayerNorm over the last axis by the mean absolute deviation.

The paper's ablation alternative to ILayerNorm (Table 2): the standard deviation becomes the L1 norm of the
centred row, so no square and no square root. For integer ``x`` (rows of ``C``)::

    d  = x * 2**shift_in - floor(sum(x) * 2**shift_in / C)   # centred as ILayerNorm centres
    l1 = max(sum(|d|), 1)
    u  = floor(d * floor(2**61 / l1) / 2**(61 - p))          # ~ (x - mean) / (C mean|x - mean|) * 2**p
    y  = clip(floor((u*b + bias + floor(2**c/2)) / 2**c) + zy, qmin, qmax)

``|d| <= l1``, so ``|d * floor(2**61/l1)| <= 2**61`` and ``|u| <= 2**p``. The converter folds
``b/2**c ~ C gamma / (sqrt(pi/2) 2**p s_y)`` (per channel, signed; ``sqrt(pi/2) mean|x - mean|`` is the
standard deviation of a normal row) and ``bias ~ beta/s_y * 2**c``. Preconditions:
``C * max|x| * 2**shift_in < 2**61`` (so the sums and ``d`` fit), ``0 <= p <= 61``,
``2**p * |b| + |bias| + 2**(c-1) < 2**62``, ``0 <= c <= 62``.
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body
from ._spec import I64, INT_IN, Port, dyadic, requantizing
from .ilayernorm import centred, centred_body, normalized, normalized_body


def reference(x, multiplier, shift, bias, y_zero_point, *, shift_in: int, p: int, qmin: int, qmax: int):
    d = centred(x, shift_in)
    u = normalized(d, np.maximum(_int.reduce_sum(np.abs(d)), 1), p)
    y = _int.round_shift(u * _int.i64(multiplier) + _int.i64(bias), shift) + _int.i64(y_zero_point)
    return _int.saturate(y, qmin, qmax, y_zero_point.dtype)


def body(g: Body) -> None:
    d = centred_body(g)
    u = normalized_body(g, d, lambda: g.maximum(g.reduce_sum_exact(g.op("Abs", d)), g.const(1)))
    g.requantize_out(g.op("Add", g.op("Mul", u, "multiplier"), "bias"))


SPEC = requantizing(
    "L1LayerNorm", __doc__, reference, body, "LayerNorm(x), requantized",
    Port("x", INT_IN, "input rows (int8/int16, or int32 within the precondition)"),
    *dyadic("b per channel (signed: gamma's sign)", "c per channel, 0..62"),
    Port("bias", I64, "beta/s_y * 2**c per channel"),
    shift_in="x and its mean scaled by 2**shift_in before centring",
    p="fraction bits of the normalized value",
)
