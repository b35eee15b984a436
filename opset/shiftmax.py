"""Shiftmax (I-ViT Alg. 1): integer softmax over the last axis with shift-based exp and one division.

For integer ``x`` with scale ``s`` (``x0 = round(1/s) >= 1``)::

    d = x - max(x)                                     # <= 0
    e = shift_exp(d, x0, n)                            # ~ 2**n * x0 * exp(d*s)
    y = int_div(e, sum(e), bits) + zy                  # ~ softmax * 2**bits, in [0, 2**bits - 1] + zy

Output scale ``2**-bits``, zero point ``zy`` (e.g. int8 with bits=7, zy=0 as released; or bits=8 with
uint8 zy=0 or int8 zy=-128). Precondition: ``L * x0 * 2**n < 2**62`` for rows of ``L`` elements
(:func:`.shift_exp.max_n`), ``1 <= bits <= 30``, and ``zy + 2**bits - 1`` fits the output type.
All intermediates are int64; ``e <= x0*2**n``, ``sum(e) < 2**62`` and ``e * floor((2**62-1)/sum) <= 2**62-1``.
"""

from __future__ import annotations

from . import _int
from ._body import Body
from ._spec import INT_IN, QUANT_OUT, Y_ZERO_POINT, OpSpec, Port
from .shift_exp import int_div, int_div_body, shift_exp, shift_exp_body


def reference(x, y_zero_point, *, x0: int, n: int, bits: int):
    x = _int.i64(x)
    e = shift_exp(x - _int.reduce_max(x), x0, n)
    y = int_div(e, _int.reduce_sum(e), bits) + _int.i64(y_zero_point)
    return y.astype(y_zero_point.dtype)


def body(g: Body) -> None:
    x = g.i64("x")
    x0, n, bits = g.attr_int("x0"), g.attr_int("n"), g.attr_int("bits")
    e = shift_exp_body(g, g.op("Sub", x, g.reduce_max(x)), x0, n)
    y = g.op("Add", int_div_body(g, e, g.reduce_sum_exact(e), bits), g.i64("y_zero_point"))
    g.op("CastLike", y, "y_zero_point", out="y")


SPEC = OpSpec(
    name="Shiftmax",
    doc=__doc__,
    inputs=(
        Port("x", INT_IN, "scores (int8 or an int32 accumulator) with scale 1/x0"),
        Y_ZERO_POINT,
    ),
    output=Port("y", QUANT_OUT, "probabilities, scale 2**-bits"),
    attributes={"x0": "round(1/s_x) >= 1", "n": "exp left shift N", "bits": "output fraction bits"},
    reference=reference,
    body=body,
)
