"""IAdd: add two integer tensors of different scales (residual, position embedding) in one rescale.

``y = clip(floor(((a-za)*ma + (b-zb)*mb + floor(2**c/2)) / 2**c) + zy, qmin, qmax)`` in int64, with
``ma/2**c ~ s_a/s_y`` and ``mb/2**c ~ s_b/s_y`` sharing one shift ``c``; ``a`` and ``b`` broadcast
(numpy rules). A single rounding, so it is exact where float ``round(a*s_a/s_y + b*s_b/s_y)`` is,
up to the dyadic error. Precondition: ``|a-za|*|ma| + |b-zb|*|mb| + 2**(c-1) < 2**62``.
"""

from __future__ import annotations

from . import _int
from ._body import Body
from ._spec import I64, INT_IN, Port, requantizing


def reference(a, b, a_zero_point, b_zero_point, a_multiplier, b_multiplier, shift, y_zero_point, *,
              qmin: int, qmax: int):
    t = (_int.i64(a) - _int.i64(a_zero_point)) * _int.i64(a_multiplier)
    t = t + (_int.i64(b) - _int.i64(b_zero_point)) * _int.i64(b_multiplier)
    y = _int.round_shift(t, shift) + _int.i64(y_zero_point)
    return _int.saturate(y, qmin, qmax, y_zero_point.dtype)


def body(g: Body) -> None:
    ta = g.op("Mul", g.op("Sub", g.i64("a"), g.i64("a_zero_point")), "a_multiplier")
    tb = g.op("Mul", g.op("Sub", g.i64("b"), g.i64("b_zero_point")), "b_multiplier")
    g.requantize_out(g.op("Add", ta, tb))


SPEC = requantizing(
    "IAdd", __doc__, reference, body, "sum, requantized",
    Port("a", INT_IN, "first addend"),
    Port("b", INT_IN, "second addend (broadcasts)"),
    Port("a_zero_point", INT_IN, "zero point of a"),
    Port("b_zero_point", INT_IN, "zero point of b"),
    Port("a_multiplier", I64, "ma: s_a/s_y = ma/2**c"),
    Port("b_multiplier", I64, "mb: s_b/s_y = mb/2**c"),
    Port("shift", I64, "c in 0..62 (scalar)"),
)
