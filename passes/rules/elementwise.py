"""Add / Mul / Div: bias adds in int32, residual adds as IAdd, constant scalings folded into the scale."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine, dtype_range

from .linear import add_bias
from .lowerer import Lowerer, Outcome

_ACC = np.dtype(np.int32)


def iadd(lw: Lowerer, a_in, b_in, t: Affine | None, out_tensor: gs.Tensor, hint: str = "add"):
    (ia, a), (ib, b) = a_in, b_in
    if t is None:  # no QuantizeLinear after it: an int32 sum at the finest scale
        t = qparams.iadd_type(a, b)
    ma, mb, c = qparams.iadd(a, b, t)
    for m, r in ((ma, a.scale / t.scale), (mb, b.scale / t.scale)):
        lw.max_dyadic_error = max(lw.max_dyadic_error, float(np.max(np.abs(np.ldexp(m, -c) - r) / r)))
    lo, hi = dtype_range(t.dtype)
    out = lw.private(
        "IAdd",
        [
            ia,
            ib,
            lw.zp(a.zero_point, a.dtype, "a_zp"),
            lw.zp(b.zero_point, b.dtype, "b_zp"),
            lw.const(ma, "a_mult"),
            lw.const(mb, "b_mult"),
            lw.const(np.int64(c), "shift"),
            lw.zp(t.zero_point, t.dtype, "y_zp"),
        ],
        t.dtype,
        hint,
        shape=out_tensor.shape,
        qmin=lo,
        qmax=hi,
    )
    lw.set(out_tensor, out, t)


def add(lw: Lowerer, node: gs.Node) -> Outcome:
    x, y = node.inputs
    gx, gy = lw.get(x), lw.get(y)
    if gx is None and gy is None:
        return Outcome.FLOAT
    # bias: an int32 accumulator plus a constant
    for got, other in ((gx, y), (gy, x)):
        if got is not None and got[1].dtype == _ACC and got[1].zero_point == 0:
            c = lw.const_float(other)
            if c is not None:
                out, t = add_bias(lw, *got, c, "bias")
                lw.set(node.outputs[0], out, t)
                return Outcome.HANDLED
    ox, oy = lw.operand(x), lw.operand(y)
    if ox is None or oy is None:
        return Outcome.FLOAT
    iadd(lw, ox, oy, lw.target(node.outputs[0]), node.outputs[0])
    return Outcome.HANDLED


def _positive_const(lw: Lowerer, t: gs.Tensor) -> np.ndarray | None:
    v = lw.const_float(t)
    if v is None or not np.issubdtype(v.dtype, np.floating) or np.any(v <= 0):
        return None
    return v.astype(np.float64)


def scale_by_const(lw: Lowerer, node: gs.Node) -> Outcome:
    """``x * k`` / ``x / k`` with positive constant ``k``: same integers, scale times ``k`` (exact)."""
    x, y = node.inputs
    for data, k in ((x, y), (y, x)) if node.op == "Mul" else ((x, y),):
        got = lw.get(data)
        kv = _positive_const(lw, k)
        if got is None or kv is None:
            continue
        it, a = got
        kv = kv if node.op == "Mul" else 1.0 / kv
        scale = a.scale * (kv.reshape(()) if kv.size == 1 else kv)
        lw.set(node.outputs[0], it, Affine(scale, a.zero_point, a.dtype, a.bound))
        lw.ctx.count("lower_integer", f"{node.op} by constant folded")
        return Outcome.HANDLED
    return Outcome.FLOAT
