"""IBertSoftmax (I-BERT Sec. 3.4, the paper's Table 2 ablation): integer softmax over the last axis with
I-BERT's second-order polynomial exp and one division per row.

For integer ``x`` on a grid where ``x0`` steps make ``ln 2`` (``x0 = round(ln2/s) >= 1``)::

    d = x - max(x)                                     # <= 0
    k = max(n + bits(qb**2 + qc) - 31, 0)              # bits(v): the bit length of v
    e = floor(poly_exp(d, x0, qb, qc, n) / 2**k)       # ~ 2**(n-k) exp(d s) / (A s**2), below 2**31
    y = int_div(e, sum(e), bits) + zy                  # ~ softmax * 2**bits, in [0, 2**bits - 1] + zy

The shift by ``k`` normalizes the exps to 31 bits before the division (I-BERT requantizes them to 16 bits
there): ``int_div``'s reciprocal ``floor((2**62-1)/S)`` is relative precise to ``S / 2**62``, and the
polynomial's ``qb**2 + qc ~ 5.8 x0**2`` would otherwise leave ``S`` near ``2**60`` (``n`` cannot be lowered
instead: exps past ``n ln2`` clamp to ``2**-n`` of the largest, which rows of thousands add up).

Output scale ``2**-bits``, zero point ``zy``: the output stage of Shiftmax. Preconditions:
``1 <= x0 <= qb <= 2**30``, ``0 <= qc <= 2**60``, ``0 <= n <= 60``, ``L * (qb**2 + qc) * 2**n < 2**61``
for rows of ``L`` elements (``max_n(qb**2 + qc, L)``), ``1 <= bits <= 30``, and ``zy + 2**bits - 1`` fits
the output type. All intermediates are int64; ``poly_exp <= (qb**2 + qc) * 2**n < 2**61``, ``e < 2**31`` and
``sum(e) < 2**61``.
"""

from __future__ import annotations

from . import _int
from ._body import Body
from ._spec import INT_IN, QUANT_OUT, Y_ZERO_POINT, OpSpec, Port
from .poly_exp import POLY_ATTRIBUTES, norm_shift, row_exps, row_exps_body
from .shift_exp import int_div, int_div_body


def reference(x, y_zero_point, *, x0: int, qb: int, qc: int, n: int, bits: int):
    e, total = row_exps(x, x0, qb, qc, n, norm_shift(qb, qc, n))
    y = int_div(e, total, bits) + _int.i64(y_zero_point)
    return y.astype(y_zero_point.dtype)


def body(g: Body) -> None:
    e, total = row_exps_body(g, normalized=True)
    y = g.op("Add", int_div_body(g, e, total, g.attr_int("bits")), g.i64("y_zero_point"))
    g.op("CastLike", y, "y_zero_point", out="y")


SPEC = OpSpec(
    name="IBertSoftmax",
    doc=__doc__,
    inputs=(
        Port("x", INT_IN, "scores (int8 or an int32 accumulator) with scale ln2/x0"),
        Y_ZERO_POINT,
    ),
    output=Port("y", QUANT_OUT, "probabilities, scale 2**-bits"),
    attributes={**POLY_ATTRIBUTES, "bits": "output fraction bits"},
    reference=reference,
    body=body,
)
