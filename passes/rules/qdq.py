"""QuantizeLinear / DequantizeLinear: DQ introduces an affine type, Q becomes a Requantize (or nothing).

Also the toolkit forms around them: an integer Clip between Q and DQ (Brevitas' QCDQ narrow range) is a
Clip of the integers, and a float weight left beside an integer activation is a reason to decline.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine
from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import const_array, node_label

from ..pattern import Op, Rule
from .lowerer import Outcome, optional_input


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
        return None if m.root.inputs[0].name in lw.alias else "a float Clip (not of a QuantizeLinear output)"

    def rewrite(self, lw, m):
        it, t = lw.alias[m.root.inputs[0].name]
        ends = zip((optional_input(m.root, 1), optional_input(m.root, 2)), t.qrange, strict=True)
        values = [const_array(b) if b is not None else np.array(e) for b, e in ends]
        if any(v is None or v.dtype.kind not in "iu" for v in values):
            raise ConversionError(
                f"{node_label(m.root)}: the bounds of an integer Clip are not integer constants"
            )
        lo, hi = (int(v.reshape(-1)[0]) for v in values)
        mins = [lw.zp(lo, t.dtype, "min"), lw.zp(hi, t.dtype, "max")]
        out = lw.node("Clip", [it, *mins], t.dtype, "clip", shape=it.shape)
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
