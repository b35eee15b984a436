"""QuantizeLinear / DequantizeLinear: DQ introduces an affine type, Q becomes a Requantize (or nothing).

Also the toolkit forms around them: an integer Clip between Q and DQ (Brevitas' QCDQ narrow range) is a
Clip of the integers, and a float weight left beside an integer activation gets a reason for refusing.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine
from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import const_array, node_label

from .lowerer import Lowerer, Outcome, broadcast_scale


def quantize(lw: Lowerer, node: gs.Node) -> Outcome:
    got = lw.get(node.inputs[0])
    if got is None:
        return Outcome.KEPT  # the input quantize: float graph input (or island output) to integer
    it, a = got
    t = lw.q_type(node, node.inputs[0])
    out = lw.requantize(it, a, t)
    lw.alias[node.outputs[0].name] = (out, t)
    lw.ctx.count("lower_integer", "QuantizeLinear folded" if out is it else "QuantizeLinear→Requantize")
    return Outcome.HANDLED


def dequantize(lw: Lowerer, node: gs.Node) -> Outcome:
    x = node.inputs[0]
    src, _ = lw.alias.get(x.name, (x, None))
    scale = const_array(node.inputs[1]).astype(np.float64)
    zp = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    dtype = zp.dtype if zp is not None else (x.dtype if x.dtype is not None else np.dtype(np.uint8))
    rank = len(x.shape) if x.shape is not None else 1
    zp_val = 0
    if zp is not None and zp.size > 1:
        if np.any(zp != 0):
            raise ConversionError(f"{node_label(node)}: per-channel non-zero zero points are not supported")
    elif zp is not None:
        zp_val = int(zp.reshape(-1)[0])
    values = const_array(src) if isinstance(src, gs.Constant) else None
    bound = int(np.max(np.abs(values.astype(np.int64) - zp_val), initial=0)) if values is not None else 0
    a = Affine(broadcast_scale(scale, node.attrs.get("axis", 1), rank), zp_val, dtype, bound=bound)
    lw.set(node.outputs[0], src, a)
    return Outcome.HANDLED


def clip(lw: Lowerer, node: gs.Node) -> Outcome:
    """QCDQ: ``Clip(QuantizeLinear(x), lo, hi)`` with integer bounds clips the integers; same affine type."""
    got = lw.alias.get(node.inputs[0].name)
    bounds = [const_array(t) if t.name else None for t in node.inputs[1:3]]
    if got is None or any(b is None or b.dtype.kind not in "iu" for b in bounds) or len(bounds) < 2:
        return Outcome.FLOAT  # a float Clip (an island), or one on the input quantize's integers (stays)
    it, t = got
    lo, hi = (int(b.reshape(-1)[0]) for b in bounds)
    out = lw.node(
        "Clip", [it, lw.zp(lo, t.dtype, "min"), lw.zp(hi, t.dtype, "max")], t.dtype, "clip", shape=it.shape
    )
    bound = max(abs(lo - t.zero_point), abs(hi - t.zero_point))
    lw.alias[node.outputs[0].name] = (out, Affine(t.scale, t.zero_point, t.dtype, bound=bound))
    lw.ctx.count("lower_integer", "QCDQ Clip (narrow range)")
    return Outcome.HANDLED


def float_weight(lw: Lowerer, node: gs.Node, index: int = 1) -> Outcome:
    """A MatMul/Gemm/Conv whose activation is integer but whose weight a toolkit left float: strict mode
    says why (ModelOpt skips GEMMs narrower than 16 outputs, e.g. a 10-class head); else a float island."""
    w = node.inputs[index] if len(node.inputs) > index else None
    v = const_array(w)
    unquantized = v is not None and v.dtype.kind == "f"
    if unquantized and lw.get(node.inputs[0]) is not None and not lw.opt.allow_float:
        raise ValueError(
            f"weight '{w.name}' is float (no DequantizeLinear): the quantizer left this {node.op} "
            "unquantized; quantize it too, or rerun with --allow-float to keep it float"
        )
    return Outcome.FLOAT
