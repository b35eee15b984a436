"""Add / Mul / Div: bias adds in int32, residual adds as IAdd, constant scalings folded into the scale."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine, dtype_range

from ..pattern import Op, Rule
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


def _bias(lw: Lowerer, node: gs.Node):
    """``(accumulator, its type, constant)`` when ``node`` adds a constant to an int32 accumulator."""
    for acc, other in (node.inputs, node.inputs[::-1]):
        got = lw.get(acc)
        if got is not None and got[1].dtype == _ACC and got[1].zero_point == 0:
            c = lw.const_float(other)
            if c is not None:
                return (*got, c)
    return None


class Add(Rule):
    """A bias (int32 accumulator plus a constant) → int32 Add; any other sum of integers → IAdd."""

    pattern = Op("Add")

    def check(self, lw, m):
        if all(lw.get(t) is None for t in m.root.inputs):
            return "no input is quantized"
        return None if _bias(lw, m.root) else lw.missing(*m.root.inputs, const_ok=True)

    def rewrite(self, lw, m):
        bias = _bias(lw, m.root)
        if bias is not None:
            lw.set(m.root.outputs[0], *add_bias(lw, *bias, "bias"))
        else:
            operands = (lw.operand(t) for t in m.root.inputs)
            iadd(lw, *operands, lw.target(m.root.outputs[0]), m.root.outputs[0])
        return Outcome.HANDLED


def _scaling(lw: Lowerer, node: gs.Node):
    """``(integer tensor, type, k)`` when ``node`` is ``x * k`` or ``x / k``, ``k`` a positive constant."""
    for data, k in (node.inputs, node.inputs[::-1]) if node.op == "Mul" else (node.inputs,):
        got, kv = lw.get(data), lw.const_float(k)
        if got is not None and kv is not None and kv.dtype.kind == "f" and np.all(kv > 0):
            return (*got, kv.astype(np.float64) if node.op == "Mul" else 1.0 / kv.astype(np.float64))
    return None


class ScaleByConst(Rule):
    """``x * k`` / ``x / k`` with positive constant ``k``: same integers, scale times ``k`` (exact)."""

    pattern = Op(("Mul", "Div"))

    def check(self, lw, m):
        return None if _scaling(lw, m.root) else "not a quantized tensor scaled by a positive constant"

    def rewrite(self, lw, m):
        it, a, k = _scaling(lw, m.root)
        scale = a.scale * (k.reshape(()) if k.size == 1 else k)
        lw.set(m.root.outputs[0], it, Affine(scale, a.zero_point, a.dtype, a.bound))
        lw.ctx.count("lower_integer", f"{m.root.op} by constant folded")
        return Outcome.HANDLED
