"""Requantize: rescale an integer tensor by a dyadic multiplier ``b / 2**c`` into a narrower type.

``y = clip(floor(((x - zx) * b + floor(2**c/2)) / 2**c) + zy, qmin, qmax)``, computed in int64,
round half up. ``b`` and ``c`` broadcast against ``x`` (per tensor, or per channel shaped for the
axis). Precondition: ``|x - zx| * |b| + 2**(c-1) < 2**62`` and ``0 <= c <= 62``
(:func:`ivit_onnx.dyadic.multiplier_bits` picks ``b``'s width from the input bound).
"""

from __future__ import annotations

from . import _int
from ._body import Body
from ._spec import INT_IN, Port, dyadic, requantizing


def reference(x, x_zero_point, multiplier, shift, y_zero_point, *, qmin: int, qmax: int):
    t = (_int.i64(x) - _int.i64(x_zero_point)) * _int.i64(multiplier)
    y = _int.round_shift(t, shift) + _int.i64(y_zero_point)
    return _int.saturate(y, qmin, qmax, y_zero_point.dtype)


def body(g: Body) -> None:
    t = g.op("Mul", g.op("Sub", g.i64("x"), g.i64("x_zero_point")), "multiplier")
    g.requantize_out(t)


SPEC = requantizing(
    "Requantize", __doc__, reference, body, "requantized tensor",
    Port("x", INT_IN, "integer input"),
    Port("x_zero_point", INT_IN, "zero point of x (scalar, x's type)"),
    *dyadic("b, broadcast against x", "c in 0..62, same shape as b"),
)
