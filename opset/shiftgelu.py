"""ShiftGELU (I-ViT Alg. 2): ``x * sigmoid(1.702 x)`` with shift-exps and one division, requantized.

For integer ``x`` with scale ``s``, ``x0 = round(1/(1.702*s)) >= 1`` (1.702 folded into the grid, as the
released kernels do), elementwise::

    m  = max(x, 0)                                        # both exp arguments below are <= 0
    e1 = shift_exp(x - m, x0, n);  e2 = shift_exp(-m, x0, n)
    sg = int_div(e1, e1 + e2, bits)                       # ~ sigmoid(1.702 x s) * 2**bits
    y  = clip(floor((x*sg*b + floor(2**c/2)) / 2**c) + zy, qmin, qmax)

so ``b/2**c ~ s * 2**-bits / s_y`` is the output rescale. ``m`` is per element, not the row max of
Alg. 2 (identical in exact arithmetic): one of ``e1``, ``e2`` is always ``x0 * 2**n``, so the sigmoid
keeps its precision where the released row max pushes every other element of a row with a large
maximum into the exp clamp (there ``GELU(2)`` comes out near ``1``), and rows of only negative
values need no fix. Preconditions: ``2 * x0 * 2**n < 2**62``, ``|x| * 2**bits * |b| + 2**(c-1) < 2**62``.
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body
from ._spec import INT_IN, Port, dyadic, requantizing
from .shift_exp import int_div, int_div_body, shift_exp, shift_exp_body


def reference(x, multiplier, shift, y_zero_point, *, x0: int, n: int, bits: int, qmin: int, qmax: int):
    x = _int.i64(x)
    m = np.maximum(x, 0)
    e1 = shift_exp(x - m, x0, n)
    e2 = shift_exp(-m, x0, n)
    sg = int_div(e1, e1 + e2, bits)
    y = _int.round_shift(x * sg * _int.i64(multiplier), shift) + _int.i64(y_zero_point)
    return _int.saturate(y, qmin, qmax, y_zero_point.dtype)


def body(g: Body) -> None:
    x = g.i64("x")
    x0, n, bits = g.attr_int("x0"), g.attr_int("n"), g.attr_int("bits")
    m = g.maximum(x, g.const(0))
    e1 = shift_exp_body(g, g.op("Sub", x, m), x0, n)
    e2 = shift_exp_body(g, g.op("Neg", m), x0, n)
    sg = int_div_body(g, e1, g.op("Add", e1, e2), bits)
    t = g.op("Mul", g.op("Mul", x, sg), "multiplier")
    g.requantize_out(t)


SPEC = requantizing(
    "ShiftGELU", __doc__, reference, body, "GELU(x), requantized",
    Port("x", INT_IN, "pre-activation (int8/int16 or an int32 accumulator)"),
    *dyadic("b: s * 2**-bits / s_y = b/2**c"),
    x0="round(1/(1.702 s)) >= 1",
    n="exp left shift N",
    bits="sigmoid fraction bits",
)
