"""QuantizeLinear / DequantizeLinear: DQ introduces an affine type, Q becomes a Requantize (or nothing).

Also the toolkit forms around them: an integer Clip between Q and DQ (Brevitas' QCDQ narrow range) is a
Clip of the integers, and a float weight left beside an integer activation is a reason to decline.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine
from ivit_onnx.graph import const_array

from ..pattern import Op, Rule
from .lowerer import Outcome


class Quantize(Rule):
    """QuantizeLinear of a lowered value becomes a Requantize (nothing when the types agree); of a float
    graph input (or an island's output) it stays: the input quantize."""

    pattern = Op("QuantizeLinear")

    def rewrite(self, lw, m):
        got = lw.get(m.root.inputs[0])
        if got is None:
            return Outcome.KEPT
        it, a = got
        t = lw.q_type(m.root, m.root.inputs[0])
        out = lw.requantize(it, a, t)
        lw.alias[m.root.outputs[0].name] = (out, t)
        lw.ctx.count("lower_integer", "QuantizeLinear folded" if out is it else "QuantizeLinear→Requantize")
        return Outcome.HANDLED


class Dequantize(Rule):
    """DequantizeLinear gives its integer input an affine type (the bound of a constant is exact)."""

    pattern = Op("DequantizeLinear")

    def rewrite(self, lw, m):
        x = m.root.inputs[0]
        src, _ = lw.alias.get(x.name, (x, None))
        a = lw.q_type(m.root, x)
        v = const_array(src) if isinstance(src, gs.Constant) else None
        bound = int(np.max(np.abs(v.astype(np.int64) - a.zero_point), initial=0)) if v is not None else 0
        lw.set(m.root.outputs[0], src, Affine(a.scale, a.zero_point, a.dtype, bound=bound))
        return Outcome.HANDLED


class Clip(Rule):
    """QCDQ: ``Clip(QuantizeLinear(x), lo, hi)`` with integer bounds clips the integers; same affine type.
    A float Clip is an island; one on the input quantize's integers stays."""

    pattern = Op("Clip")

    def check(self, lw, m):
        if m.root.inputs[0].name not in lw.alias:
            return "input is not a QuantizeLinear output (a float Clip)"
        bounds = [const_array(t) if t.name else None for t in m.root.inputs[1:3]]
        if len(bounds) < 2 or any(b is None or b.dtype.kind not in "iu" for b in bounds):
            return "min and max are not integer constants"
        return None

    def rewrite(self, lw, m):
        it, t = lw.alias[m.root.inputs[0].name]
        lo, hi = (int(const_array(b).reshape(-1)[0]) for b in m.root.inputs[1:3])
        out = lw.node(
            "Clip",
            [it, lw.zp(lo, t.dtype, "min"), lw.zp(hi, t.dtype, "max")],
            t.dtype,
            "clip",
            shape=it.shape,
        )
        bound = max(abs(lo - t.zero_point), abs(hi - t.zero_point))
        lw.alias[m.root.outputs[0].name] = (out, Affine(t.scale, t.zero_point, t.dtype, bound=bound))
        lw.ctx.count("lower_integer", "QCDQ Clip (narrow range)")
        return Outcome.HANDLED


def float_weight(lw, node: gs.Node) -> str | None:
    """A MatMul/Gemm/Conv whose activation is integer but whose weight a toolkit left float (ModelOpt
    skips GEMMs narrower than 16 outputs, e.g. a 10-class head) declines with this reason."""
    w = node.inputs[1]
    v = const_array(w)
    if v is not None and v.dtype.kind == "f" and lw.get(node.inputs[0]) is not None:
        return (
            f"weight '{w.name}' is float (no DequantizeLinear): the quantizer left this {node.op} "
            "unquantized; quantize it too"
        )
    return None
