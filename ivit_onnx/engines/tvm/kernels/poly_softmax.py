"""IBertSoftmax and LogIntSoftmax (the paper's Softmax ablation) as row kernels, scheduled like Shiftmax by
:func:`.rows.schedule`: I-BERT's polynomial exp recomputed where read, the row max and exp sum as reductions,
per-row scalars (IBertSoftmax's reciprocal; LogIntSoftmax's level thresholds ``floor(2 S / D_k)``, one
division each) computed once per row, no division per element (``x0`` is a compile-time constant).
int64 throughout: the exps reach ``(qb**2 + qc) * 2**n``."""

from __future__ import annotations

from tvm import te, tirx

from ivit_onnx.opset import log_int_softmax as lis
from ivit_onnx.opset.poly_exp import norm_shift

from .arith import I32, I64, at, const, let, wide
from .rows import _row, int_softmax, output_row_sum, row_exps


def poly_exp(d: tirx.PrimExpr, x0: int, qb: int, qc: int, n: int, k: int = 0) -> tirx.PrimExpr:
    """``opset.poly_exp.poly_exp`` of int64 ``d <= 0`` shifted right by ``k`` (``row_exps``'s), as int64."""

    def from_q(a, q):
        t = const(qb) - (a - q * const(x0))
        return let(t, lambda t: ((t * t + const(qc)) << (const(n) - q)) >> const(k), "t")

    def from_a(a):
        return let(tirx.truncdiv(a, const(x0)), lambda q: from_q(a, q), "q")  # a >= 0

    return let(tirx.min(-wide(d), const(n * x0)), from_a, "a")


def ibert_softmax(x, zy, *, x0: int, qb: int, qc: int, n: int, bits: int, row_sum: bool = False):
    """``opset.ibert_softmax.reference`` over the last axis (``row_sum``: :func:`.rows.int_softmax`)."""
    k = norm_shift(qb, qc, n)
    return int_softmax(
        x, zy, lambda d: poly_exp(d, x0, qb, qc, n, k), bits=bits, row_sum=row_sum, name="ivit_ibertsoftmax"
    )


def log_int_softmax(
    x, zy, *, x0: int, qb: int, qc: int, n: int, bits: int, log_bits: int, row_sum: bool = False
):
    """``opset.log_int_softmax.reference`` over the last axis: the level ``q`` of each exp counts the row's
    thresholds it lies under, its output the level's value (``row_sum``: :func:`.rows.int_softmax`)."""
    shape, rows = list(x.shape), list(x.shape[:-1])
    exp, total = row_exps(x, lambda d: poly_exp(d, x0, qb, qc, n))
    k = lis.levels(bits, log_bits)

    def threshold(d: int):  # floor(2 S / d), S >= 0
        return lambda *r: tirx.truncdiv(total[r] * const(2), const(d))

    thresholds = [
        te.compute(rows, threshold(d), name=f"row_level{j}") for j, d in enumerate(lis.divisors(k), start=1)
    ]
    one, zero = const(1, I32), const(0, I32)

    def level(e, row):
        q = one * 0
        for theta in thresholds:
            q = q + tirx.Select(e <= theta[row], one, zero)
        return q.astype(I64)

    def value(q):  # lis.level_values: q < K ? min(2**(bits - q), 2**bits - 1) : 0, for 0 <= q <= K
        # the min as a Select on q == 0: TVM 0.27's simplifier drops min(1 << (bits - q), 2**bits - 1) as if
        # the shift could not reach 2**bits
        power = const(1) << tirx.max(const(bits) - q, const(0))
        level = tirx.Select(q == const(0), const((1 << bits) - 1), power)
        return tirx.Select(q < const(k), level, const(0))

    def out(*i):
        y = let(exp(*i), lambda e: let(level(e, _row(i)), value, "q"), "e")
        return (y + wide(at(zy, i, shape))).astype(str(zy.dtype))

    y = te.compute(shape, out, name="ivit_logintsoftmax")
    return [y, output_row_sum(y)] if row_sum else y


#: op_type -> row kernel (the converters' table, :mod:`.frontend`)
KERNELS = {"IBertSoftmax": ibert_softmax, "LogIntSoftmax": log_int_softmax}
