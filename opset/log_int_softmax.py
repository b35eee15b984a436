"""LogIntSoftmax (FQ-ViT's Log-Int-Softmax, Lin et al., IJCAI 2022; the paper's Table 2 ablation):
I-BERT's polynomial exp, then the probability quantized to a power of two, round to nearest in log2.

For integer ``x`` on the ``ln 2`` grid of IBertSoftmax (same ``x0, qb, qc, n``)::

    d = x - max(x);  e = poly_exp(d, x0, qb, qc, n);  S = sum(e)
    K = min(2**log_bits, bits + 1)                     # levels to tell apart (2**-q beyond bits is 0)
    D_1 = 3;  D_k = 3 * 2**(k-1) - 1  (k >= 2)         # 2 T_k - 1 for the thresholds T_k below
    q = #{k in 1..K : e <= floor(2 S / D_k)}           # = min(log_round(round(S / e)), K)
    y = (q < K ? min(2**(bits - q), 2**bits - 1) : 0) + zy

FQ-ViT computes ``v = round(S / e)`` and ``log_round(v) = floor(log2 v) + [v - 2**floor(log2 v) >=
2**(floor(log2 v) - 1)]``, keeps ``2**-q`` for ``q < 2**log_bits`` (4-bit levels) and 0 beyond. Here
``log_round(v) >= k`` exactly when ``v >= T_k`` (``T_1 = 2``, ``T_k = 3 * 2**(k-2)``), and ``round(S/e) >= T``
exactly when ``e <= floor(2 S / (2 T - 1))`` (``round`` half up): one division per row and level, none per
element. The level ``2**-q`` is written on the output grid ``2**-bits`` (the scale of the QuantizeLinear
after it, so the following P·V stays an 8-bit GEMM): levels below ``2**-bits`` are 0, and ``q = 0`` (a
probability of 1) saturates to ``2**bits - 1`` as that QuantizeLinear would.

Output scale ``2**-bits``, zero point ``zy``. Preconditions: those of IBertSoftmax (``2 S < 2**62``), and
``1 <= log_bits <= 5``.
"""

from __future__ import annotations

import numpy as np

from . import _int
from ._body import Body
from ._spec import INT_IN, QUANT_OUT, Y_ZERO_POINT, OpSpec, Port
from .poly_exp import POLY_ATTRIBUTES, row_exps, row_exps_body

#: the most levels K can ask for (bits <= 30): divisors D_1..D_31
MAX_LEVELS = 31


def divisors(k: int) -> list[int]:
    """``D_1..D_k``: ``2 T_j - 1`` for the rounding thresholds ``T_1 = 2``, ``T_j = 3 * 2**(j-2)``."""
    return [3] + [3 * 2 ** (j - 1) - 1 for j in range(2, k + 1)]


def levels(bits: int, log_bits: int) -> int:
    """``K``: the level past which every output is 0 (``2**log_bits`` levels, none below ``2**-bits``)."""
    return min(1 << log_bits, bits + 1)


def level_values(bits: int, k: int) -> np.ndarray:
    """The output integer of each level ``q = 0..K`` (K: beyond the last one, 0)."""
    q = np.arange(k + 1, dtype=np.int64)
    return np.where(q < k, np.minimum(_int.pow2(np.maximum(bits - q, 0)), (1 << bits) - 1), 0)


def reference(x, y_zero_point, *, x0: int, qb: int, qc: int, n: int, bits: int, log_bits: int):
    e, total = row_exps(x, x0, qb, qc, n)
    k = levels(bits, log_bits)
    q = sum((e <= (2 * total) // d).astype(np.int64) for d in divisors(k))
    y = level_values(bits, k)[q] + _int.i64(y_zero_point)
    return y.astype(y_zero_point.dtype)


def body(g: Body) -> None:
    e, total = row_exps_body(g)
    bits = g.attr_int("bits")
    k = g.minimum(g.pow2(g.attr_int("log_bits")), g.op("Add", bits, g.const(1)))
    two_s, never = g.op("Add", total, total), g.const(-1)
    q = None
    for j, d in enumerate(divisors(MAX_LEVELS), start=1):  # threshold j counts only where j <= K
        theta = g.op("Where", g.op("Less", k, g.const(j)), never, g.op("Div", two_s, g.const(d)))
        hit = g.i64(g.op("LessOrEqual", e, theta))
        q = hit if q is None else g.op("Add", q, hit)
    top = g.op("Sub", g.pow2(bits), g.const(1))
    level = g.minimum(g.pow2(g.maximum(g.op("Sub", bits, q), g.const(0))), top)
    y = g.op("Where", g.op("Less", q, k), level, g.const(0))
    g.op("CastLike", g.op("Add", y, g.i64("y_zero_point")), "y_zero_point", out="y")


SPEC = OpSpec(
    name="LogIntSoftmax",
    doc=__doc__,
    inputs=(
        Port("x", INT_IN, "scores (int8 or an int32 accumulator) with scale ln2/x0"),
        Y_ZERO_POINT,
    ),
    output=Port("y", QUANT_OUT, "probabilities 2**-q on the grid 2**-bits"),
    attributes={**POLY_ATTRIBUTES, "bits": "output fraction bits", "log_bits": "log2 of the level count"},
    reference=reference,
    body=body,
)
