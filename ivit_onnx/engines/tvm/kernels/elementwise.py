"""Requantize, IAdd, ShiftGELU and IBertGELU as single-stage ``te.compute`` functions Relax can fuse into
neighbours.

Each op is one injective (elementwise or broadcast) block, so ``AnnotateTIROpPattern`` + ``FuseOps`` +
``FuseTIR`` fold it into the producing GEMM's epilogue (MatMulInteger + bias + Requantize) or into the
next elementwise op, and the fused function is scheduled like any other (dlight / :mod:`..chains`).
Rescales are shifts, never divisions. ShiftGELU's sigmoid needs ``floor((2**62-1) / (e1+e2))`` per element;
its value depends on ``x`` alone and is constant outside ``[D, -D]`` (:func:`.arith.exp_floor`), so where
that range holds at most :data:`TABLE_MAX` values the sigmoid comes from a table computed at compile time
by the numpy reference itself (exact by construction); otherwise the kernel divides per element (int64).
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from ivit_onnx.opset import shift_exp as ref_exp

from .arith import (
    I32,
    RECIP_M,
    at,
    bits_of,
    const,
    exp_floor,
    int_div,
    let,
    round_shift,
    saturate,
    shift_exp,
    wide,
)

#: largest ShiftGELU sigmoid table (int32 entries; 128 Ki = 512 KiB)
TABLE_MAX = 1 << 17


def _shape(*tensors) -> list:
    return [
        tirx.IntImm("int64", d)
        for d in np.broadcast_shapes(*[tuple(int(s) for s in t.shape) for t in tensors])
    ]


def requantize(x, zx, b, c, zy, *, qmin: int, qmax: int) -> te.Tensor:
    """``opset.requantize.reference``: ``clip(round_shift((x - zx) * b, c) + zy)``."""
    shape = list(x.shape)

    def elem(*i):
        t = (wide(x[i]) - wide(at(zx, i, shape))) * at(b, i, shape)
        return saturate(round_shift(t, at(c, i, shape)) + wide(at(zy, i, shape)), qmin, qmax, str(zy.dtype))

    return te.compute(shape, elem, name="ivit_requantize")


def iadd(a, b, za, zb, ma, mb, c, zy, *, qmin: int, qmax: int) -> te.Tensor:
    """``opset.iadd.reference``: ``clip(round_shift((a-za)*ma + (b-zb)*mb, c) + zy)``, a and b broadcast."""
    shape = _shape(a, b)

    def elem(*i):
        t = (wide(at(a, i, shape)) - wide(at(za, i, shape))) * at(ma, i, shape)
        t = t + (wide(at(b, i, shape)) - wide(at(zb, i, shape))) * at(mb, i, shape)
        return saturate(round_shift(t, at(c, i, shape)) + wide(at(zy, i, shape)), qmin, qmax, str(zy.dtype))

    return te.compute(shape, elem, name="ivit_iadd")


def gelu_table_range(x_dtype: str, x0: int, n: int) -> tuple[int, int] | None:
    """``(lo, hi)``: the inputs whose sigmoids differ (``x`` clipped to them keeps its sigmoid), or None when
    more than :data:`TABLE_MAX` values."""
    d = exp_floor(x0, n)
    xmin, xmax = bits_of(x_dtype)
    lo, hi = max(d, xmin), min(-d, xmax)
    return (lo, hi) if hi - lo + 1 <= TABLE_MAX else None


def gelu_table(lo: int, hi: int, x0: int, n: int, bits: int) -> np.ndarray:
    """``int_div(e1, e1 + e2, bits)`` of ShiftGELU for every ``x`` in ``[lo, hi]``, by the numpy reference,
    then the last value repeated up to a power-of-two length (the sigmoid is constant beyond ``hi``): ops
    whose ranges differ get tables of one shape, hence one kernel (``lo`` is a runtime scalar)."""
    x = np.arange(lo, hi + 1, dtype=np.int64)
    m = np.maximum(x, 0)
    e1, e2 = ref_exp.shift_exp(x - m, x0, n), ref_exp.shift_exp(-m, x0, n)
    table = ref_exp.int_div(e1, e1 + e2, bits).astype(np.int32)  # in [0, 2**bits], bits <= 30
    size = 1 << (len(table) - 1).bit_length()
    return np.concatenate([table, np.full(size - len(table), table[-1], np.int32)])


def shiftgelu(
    x, b, c, zy, table=None, lo=None, *, x0: int, n: int, bits: int, qmin: int, qmax: int
) -> te.Tensor:
    """``opset.shiftgelu.reference``; ``table`` (from :func:`gelu_table`, its first entry for the int64 scalar
    tensor ``lo``) or per-element division."""
    shape = list(x.shape)

    def sigmoid(xv):
        if table is not None:
            idx = tirx.max(tirx.min(xv - lo[()], const(int(table.shape[0]) - 1)), const(0))
            return wide(table[idx.astype(I32)])
        m = tirx.max(xv, const(0))
        return let(
            shift_exp(xv - m, x0, n),
            lambda e1: int_div(e1, tirx.truncdiv(const(RECIP_M), e1 + shift_exp(-m, x0, n)), bits),
            "e1",
        )

    def elem(*i):  # x is read, not Let-bound: a table index must not name a Let variable (block regions)
        t = wide(x[i]) * sigmoid(wide(x[i])) * at(b, i, shape)
        return saturate(round_shift(t, at(c, i, shape)) + wide(at(zy, i, shape)), qmin, qmax, str(zy.dtype))

    return te.compute(shape, elem, name="ivit_shiftgelu")


def ibert_gelu(x, b, c, zy, *, clip: int, coeff: int, k: int, qmin: int, qmax: int) -> te.Tensor:
    """``opset.ibertgelu.reference``: the erf polynomial needs no division, so one int64 expression per
    element (``D = round_shift(coeff, k)`` folded at compile time)."""
    shape = list(x.shape)
    half = (1 << k) >> 1
    d = const((coeff + half) >> k)

    def g(v):  # D -+ round_shift(coeff - max(clip - |v|, 0)**2, k)
        t = tirx.max(const(clip) - tirx.abs(v), const(0))
        e = (const(coeff + half) - t * t) >> const(k)
        return tirx.Select(v < const(0), d - e, d + e)

    def elem(*i):
        t = let(wide(x[i]), lambda v: v * g(v), "v") * at(b, i, shape)
        return saturate(round_shift(t, at(c, i, shape)) + wide(at(zy, i, shape)), qmin, qmax, str(zy.dtype))

    return te.compute(shape, elem, name="ivit_ibertgelu")
