"""Selections and index writes pass the affine type through: they pick or place elements, never mix them.

- ReduceMax / ReduceMin / GlobalMaxPool / TopK: ``(q - zp) * s`` is increasing in ``q`` (``s > 0``), so the
  same op on the integers selects the same elements, ties and TopK's indices included (exact).
- ScatterND / ScatterElements write ``updates`` into ``data``: exact when both have one type (else decline).

onnxruntime runs some of these on 8-bit and 32-bit integers only: other types are widened to int32 and
narrowed back, both exact (the values fit).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine

from ..pattern import Op, Rule
from .lowerer import Lowerer, Outcome

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
#: the element types onnxruntime's CPU kernels take, by op (others are widened to int32)
_KERNEL_TYPES = {
    "ReduceMax": (*_EIGHT_BIT, np.dtype(np.int32)),
    "ReduceMin": (*_EIGHT_BIT, np.dtype(np.int32)),
    "Resize": (*_EIGHT_BIT, np.dtype(np.int32)),  # (resize.py)
}


def on_integers(lw: Lowerer, node, op: str, inputs: list, a: Affine, attrs: dict) -> None:
    """``op`` on integer ``inputs[0]`` of type ``a`` (widened to int32 and back where onnxruntime needs);
    its output bound to ``node``'s with type ``a``."""
    it, wide = inputs[0], a.dtype not in _KERNEL_TYPES.get(op, (a.dtype,))
    if wide:
        it = lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
    shape = node.outputs[0].shape
    out = lw.node(op, [it, *inputs[1:]], np.int32 if wide else a.dtype, op.lower(), attrs=attrs, shape=shape)
    if wide:
        out = lw.node("Cast", [out], a.dtype, "narrow", attrs={"to": a.dtype.type}, shape=shape)
    lw.set(node.outputs[0], out, a)


class OrderSelection(Rule):
    """ReduceMax / ReduceMin / GlobalMaxPool / TopK on the integers (GlobalMaxPool as a ReduceMax over the
    spatial axes: onnxruntime's takes floats only); TopK's indices are its own int64 output."""

    pattern = Op(("ReduceMax", "ReduceMin", "GlobalMaxPool", "TopK"))

    def check(self, lw, m):
        why = lw.missing(m.root.inputs[0])
        if why is None and m.root.op == "GlobalMaxPool" and m.root.inputs[0].shape is None:
            return "input rank not known at conversion time"
        return why

    def rewrite(self, lw, m):
        node = m.root
        it, a = lw.per_tensor(*lw.get(node.inputs[0]))
        if node.op == "GlobalMaxPool":
            axes = list(range(2, len(node.inputs[0].shape)))
            if lw.ctx.opset >= 18:
                on_integers(lw, node, "ReduceMax", [it, lw.const(np.array(axes, np.int64), "axes")], a, {})
            else:
                on_integers(lw, node, "ReduceMax", [it], a, {"axes": axes})
        elif node.op == "TopK":  # the integer TopK writes the original int64 indices tensor
            values = gs.Variable(lw.fresh("topk_values"), dtype=a.dtype, shape=node.outputs[0].shape)
            args, outs = [it, *node.inputs[1:]], [values, node.outputs[1]]
            lw.g.nodes.append(gs.Node("TopK", lw.fresh("topk"), dict(node.attrs), args, outs))
            lw.set(node.outputs[0], values, a)
        else:
            on_integers(lw, node, node.op, [it, *node.inputs[1:]], a, node.attrs)
        lw.ctx.count("lower_integer", f"{node.op} on the integers")
        return Outcome.HANDLED


class Scatter(Rule):
    """ScatterND / ScatterElements of quantized updates into quantized data of the same type."""

    pattern = Op(("ScatterND", "ScatterElements"))

    def check(self, lw, m):
        data, upd = m.root.inputs[0], m.root.inputs[2]
        why = lw.missing(data, upd)
        if why is not None:
            return why
        a, b = lw.get(data)[1], lw.get(upd)[1]
        if not (a.per_tensor and b.per_tensor and a.same_as(b)):
            return f"updates ({b.describe()}) and data ({a.describe()}) are not of one quantized type"
        return None

    def rewrite(self, lw, m):
        node = m.root
        (it, a), (iu, _) = lw.get(node.inputs[0]), lw.get(node.inputs[2])
        out = lw.node(node.op, [it, node.inputs[1], iu], a.dtype, node.op.lower(), attrs=node.attrs,
                      shape=node.outputs[0].shape)
        lw.set(node.outputs[0], out, a)
        lw.ctx.count("lower_integer", f"{node.op} on the integers")
        return Outcome.HANDLED
