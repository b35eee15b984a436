"""TE twins of the opset's integer primitives (``opset/_int.py``, ``opset/shift_exp.py``), as expressions.

Every helper returns a TIR expression for one output element, so an op is one ``te.compute`` whose
intermediates are ``Let`` bindings (computed once, never a buffer). Floor division by ``2**c`` is an
arithmetic right shift of a signed value (TVM's ``>>`` on signed types), never a division; division by a
compile-time constant is a truncating division of a non-negative value (compilers turn it into a multiply).
Widths: int32 wherever the op's attributes and input dtype bound the value below ``2**31``, else int64.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

I32, I64 = "int32", "int64"
#: ``2**62 - 1``, the dividend of IntDiv's reciprocal (``opset/_int.RECIP_M``)
RECIP_M = (1 << 62) - 1


def const(value: int, dtype: str = I64) -> tirx.PrimExpr:
    return tirx.const(int(value), dtype)


def let(value: tirx.PrimExpr, body, name: str = "v") -> tirx.PrimExpr:
    """``body(v)`` with ``v`` bound once to ``value`` (a TIR Let: computed once where ``v`` is read twice)."""
    var = tirx.Var(name, dtype_of(value))
    return tirx.Let(var, value, body(var))


def dtype_of(x) -> str:
    """The dtype of a TIR expression (``TensorSlice.dtype``, else its type)."""
    return str(x.dtype) if hasattr(x, "dtype") else str(x.ty)


def wide(x: tirx.PrimExpr) -> tirx.PrimExpr:
    return x if dtype_of(x) == I64 else x.astype(I64)


def at(t: te.Tensor, index: list, out_shape: list) -> tirx.PrimExpr:
    """``t`` read at output ``index`` with numpy broadcasting (static shapes; size-1 axes read index 0)."""
    rank, out_rank = len(t.shape), len(out_shape)
    idx = []
    for k, dim in enumerate(t.shape):
        o = out_rank - rank + k
        same = (
            isinstance(dim, tirx.IntImm)
            and isinstance(out_shape[o], tirx.IntImm)
            and int(dim) == int(out_shape[o])
        )
        idx.append(index[o] if same or not (isinstance(dim, tirx.IntImm) and int(dim) == 1) else 0)
    return t[tuple(idx)]


def bits_of(dtype: str) -> tuple[int, int]:
    """(min, max) of an integer dtype."""
    info = np.iinfo(np.dtype(str(dtype)))
    return int(info.min), int(info.max)


def round_shift(t: tirx.PrimExpr, c: tirx.PrimExpr) -> tirx.PrimExpr:
    """``floor((t + floor(2**c/2)) / 2**c)`` of int64 ``t`` (``|t| + 2**(c-1) < 2**62``, ``0 <= c <= 62``)."""
    c = wide(c)
    return (t + ((const(1) << c) >> const(1))) >> c


def saturate(y: tirx.PrimExpr, qmin: int, qmax: int, dtype: str) -> tirx.PrimExpr:
    """``clip(y, qmin, qmax)`` cast to ``dtype`` (never wraps: ``[qmin, qmax]`` lies inside ``dtype``)."""
    dt = dtype_of(y)
    return tirx.max(tirx.min(y, const(qmax, dt)), const(qmin, dt)).astype(str(dtype))


def _p_of(d: int) -> int:
    """The shift-exp's ``d + floor(d/2) - floor(d/16)`` in Python integers."""
    return d + (d >> 1) - (d >> 4)


def exp_floor(x0: int, n: int) -> int:
    """A ``D <= 0`` with ``p(D) <= -n*x0``: since ``p`` is non-decreasing, ``shift_exp(max(d, D)) ==
    shift_exp(d)`` for every ``d <= 0`` (both clamp), and ``|max(d, D)|`` is bounded by about ``0.7 n x0``."""
    d = -((n * x0 * 16) // 23)
    while _p_of(d) > -n * x0:
        d -= 1
    return d


def exp_dtype(x0: int, n: int) -> str:
    """int32 for the shift-exp's ``p, q, r`` when ``n*x0`` (their bound, with margin) fits, else int64."""
    return I32 if 2 * (n + 1) * x0 < 2**31 else I64


def exp_constants(x0: int, n: int) -> np.ndarray:
    """The ``x0``-dependent constants of :func:`shift_exp`'s int32 path as a runtime int64 tensor, so row
    kernels that differ only in ``x0`` are one kernel: ``x0``, :func:`exp_floor`, ``-n*x0``, and ``m, s`` with
    ``floor(a / x0) == (a * m) >> s`` for ``0 <= a < 2**31`` (Granlund & Montgomery 1994, Thm 4.2:
    ``l = ceil(log2 x0)``, ``s = 31 + l``, ``m = ceil(2**s / x0) <= 2**32``, so ``a * m < 2**63``)."""
    s = 31 + (x0 - 1).bit_length()
    m = -(-(1 << s) // x0)
    return np.array([x0, exp_floor(x0, n), -n * x0, m, s], np.int64)


def shift_exp(d: tirx.PrimExpr, x0: int, n: int, consts: te.Tensor | None = None) -> tirx.PrimExpr:
    """``opset.shift_exp.shift_exp`` of int64 ``d <= 0``, as int64 (``1 <= e <= x0 * 2**n``).

    ``d`` is first raised to :func:`exp_floor` (exact, see there) so ``p, q, r`` fit :func:`exp_dtype`; the
    division by ``x0`` is a truncating division of ``-p >= 0`` (``< 2**31`` on the int32 path). With
    ``consts`` (:func:`exp_constants`, int32 path only) the constants are read from it and the division is a
    multiply and shift; else they are compile-time constants."""
    dt = exp_dtype(x0, n)
    if consts is not None and dt == I32:
        x0_, floor, lo = consts[0].astype(dt), consts[1], consts[2].astype(dt)

        def div(a):
            return ((wide(a) * consts[3]) >> consts[4]).astype(dt)
    else:
        x0_, floor, lo = const(x0, dt), const(exp_floor(x0, n)), const(-n * x0, dt)

        def div(a):
            return tirx.truncdiv(a, x0_)

    d = tirx.max(wide(d), floor).astype(dt)

    def from_d(d):
        p = tirx.max(d + (d >> const(1, dt)) - (d >> const(4, dt)), lo)
        return let(
            -p,
            lambda neg_p: let(
                div(neg_p),
                lambda q: (
                    (x0_ - ((neg_p - q * x0_ + const(1, dt)) >> const(1, dt))).astype(I64)
                    << (const(n, dt) - q).astype(I64)
                ),
                "q",
            ),
            "neg_p",
        )

    return let(d, from_d, "d")


def int_div(e: tirx.PrimExpr, f: tirx.PrimExpr, bits: int) -> tirx.PrimExpr:
    """IntDiv's ``floor(e * f / 2**(62-bits))`` given the reciprocal ``f = floor((2**62-1) / s)``."""
    return (wide(e) * f) >> const(62 - bits)


def _isqrt_step(rem: te.Tensor, res: te.Tensor | None, k: int) -> tuple[te.Tensor | None, te.Tensor]:
    """One digit of :func:`isqrt_stages`: the next remainder (None for the last digit) and root so far."""
    bit = const(1 << (2 * k))

    def prev(i):
        return const(0) if res is None else res[i]

    def next_res(*i):
        return tirx.Select(rem[i] >= prev(i) + bit, (prev(i) >> const(1)) + bit, prev(i) >> const(1))

    def next_rem(*i):
        return tirx.Select(rem[i] >= prev(i) + bit, rem[i] - prev(i) - bit, rem[i])

    new_rem = te.compute(rem.shape, next_rem, name=f"isqrt_rem{k}") if k else None
    return new_rem, te.compute(rem.shape, next_res, name=f"isqrt_res{k}")


def isqrt_stages(v: te.Tensor) -> te.Tensor:
    """Exact ``floor(sqrt(v))`` of int64 ``0 <= v < 2**62``, digit by digit: 31 steps over ``v``'s shape, each
    two single-output stages (no division; a chain of ``Let`` bindings trips TVM's simplifier, and a
    two-output stage makes ``compute_at`` keep every row's value in each cuda thread block). Any exact
    integer square root equals the reference's Newton iteration (``opset.ilayernorm.isqrt``)."""
    rem, res = v, None
    for k in range(30, -1, -1):
        rem, res = _isqrt_step(rem, res, k)
    return res
