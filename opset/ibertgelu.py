"""IBertGELU (I-BERT's i-GELU, Kim et al. 2021): ``x (1 + erf(x / sqrt 2)) / 2``, erf a 2nd-order polynomial.

The paper's ablation alternative to ShiftGELU (Table 2). I-BERT's erf is
``L(z) = sign(z) * (a * (min(|z|, -b) + b)**2 + 1)`` with ``a = -0.2888``, ``b = -1.769``. For integer ``x``
with scale ``s``, on erf's grid ``s' = s / sqrt 2``, with ``clip ~ -b/s'`` and ``coeff ~ -1/(a s'**2)``,
elementwise::

    t = max(clip - |x|, 0)                       # -(min(|x|, clip) - clip)
    e = round_shift(coeff - t*t, k)              # ~ |L(x s')| * D, in [0, D]
    D = round_shift(coeff, k)                    # ~ 1 / |a s'**2 2**k|: |L| = 1 beyond the clip point
    g = D - e if x < 0 else D + e                # ~ (1 + L(x s')) * D = 2 D Phi(x s), in [0, 2 D]
    y = clip(floor((x*g*b + floor(2**c/2)) / 2**c) + zy, qmin, qmax)

so ``b/2**c ~ s / (2 D s_y)`` is the output rescale (``b`` may be per channel). At ``x = 0`` either
branch of ``g`` gives ``y = zy``. No division anywhere: the polynomial is multiplies and adds.
Preconditions: ``0 <= clip``, ``clip**2 <= coeff``, ``coeff + 2**k < 2**62``, ``0 <= k <= 62``,
``|x| * 2 * D * |b| + 2**(c-1) < 2**62``, ``0 <= c <= 62``.
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body
from ._spec import INT_IN, Port, dyadic, requantizing


def reference(x, multiplier, shift, y_zero_point, *, clip: int, coeff: int, k: int, qmin: int, qmax: int):
    x = _int.i64(x)
    t = np.maximum(clip - np.abs(x), 0)
    e = _int.round_shift(coeff - t * t, k)
    d = _int.round_shift(np.int64(coeff), k)
    g = np.where(x < 0, d - e, d + e)
    y = _int.round_shift(x * g * _int.i64(multiplier), shift) + _int.i64(y_zero_point)
    return _int.saturate(y, qmin, qmax, y_zero_point.dtype)


def body(g: Body) -> None:
    x = g.i64("x")
    clip, coeff, k = g.attr_int("clip"), g.attr_int("coeff"), g.attr_int("k")
    t = g.maximum(g.op("Sub", clip, g.op("Abs", x)), g.const(0))
    e = g.round_shift(g.op("Sub", coeff, g.op("Mul", t, t)), k)
    d = g.round_shift(coeff, k)
    gx = g.op("Where", g.op("Less", x, g.const(0)), g.op("Sub", d, e), g.op("Add", d, e))
    g.requantize_out(g.op("Mul", g.op("Mul", x, gx), "multiplier"))


SPEC = requantizing(
    "IBertGELU", __doc__, reference, body, "GELU(x), requantized",
    Port("x", INT_IN, "pre-activation (int8/int16 or an int32 accumulator)"),
    *dyadic("b: s / (2 D s_y) = b/2**c, D = round_shift(coeff, k)"),
    clip="round(1.769 / s'), s' = s / sqrt 2: the erf polynomial's clip point",
    coeff="round(1 / (0.2888 s'**2)) >= clip**2: the polynomial's constant",
    k="fraction bits dropped from the erf (I-BERT's const)",
)
