"""Layout ops pass the affine type through: the same op runs on the integers (Reshape, Transpose, ...)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine

from ..pattern import Op, Rule
from .lowerer import Lowerer, Outcome

#: ops whose first input is the data and whose outputs are rearranged/selected elements of it
PASS_THROUGH = (
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Slice",
    "Gather",
    "GatherND",  # #11: timm's relative-position index under the dynamo exporter
    "Split",
    "Expand",
    "Tile",
    "Identity",
    "Dropout",
    "MaxPool",
    "GatherElements",  # #27: ViTMAE's token un-shuffle
    "ReverseSequence",
    "DepthToSpace",
    "SpaceToDepth",
)
#: pass-through ops that onnxruntime runs on 8-bit integers only
_EIGHT_BIT_ONLY = ("MaxPool", "DepthToSpace", "SpaceToDepth")


def _transpose(lw: Lowerer, node: gs.Node, it, a: Affine) -> Outcome:
    """Transpose permutes a per-channel scale with the data; a constant is transposed at rewrite time."""
    rank = len(it.shape) if it.shape is not None else None
    perm = node.attrs.get("perm") or list(range(rank))[::-1]
    t = a
    if not a.per_tensor:
        scale = a.scale.reshape((1,) * (len(perm) - a.scale.ndim) + a.scale.shape).transpose(perm)
        t = Affine(scale, a.zero_point, a.dtype, a.bound)
    if isinstance(it, gs.Constant):
        out = lw.const(np.ascontiguousarray(np.asarray(it.values).transpose(perm)), "transposed")
    else:
        out = lw.node(
            "Transpose", [it], a.dtype, "transpose", attrs={"perm": perm}, shape=node.outputs[0].shape
        )
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED


class PassThrough(Rule):
    """The same layout op runs on the integers; the type passes through (per-channel scales of a
    Transpose move with the data; other ops need a per-tensor type)."""

    pattern = Op(PASS_THROUGH)

    def check(self, lw, m):
        why = lw.missing(m.root.inputs[0], const_ok=True)
        got = lw.get(m.root.inputs[0])
        if why is None and m.root.op in _EIGHT_BIT_ONLY and got is not None:
            a = got[1] if got[1].per_tensor else qparams.per_tensor(got[1])
            if a.dtype.itemsize != 1:
                return f"onnxruntime runs {m.root.op} on 8-bit integers only (input is {a.dtype.name})"
        return why

    def rewrite(self, lw, m):
        node = m.root
        got = lw.operand(node.inputs[0])
        if node.op == "Transpose":
            return _transpose(lw, node, *got)
        it, a = lw.per_tensor(*got)
        n_out = 1 if node.op == "Dropout" else len(node.outputs)
        rest = list(node.inputs[1:]) if node.op != "Dropout" else []
        outs = lw.node(node.op, [it, *rest], a.dtype, node.op.lower(), attrs=node.attrs, n_out=n_out)
        for orig, new in zip(node.outputs, outs if n_out > 1 else [outs], strict=False):
            new.shape = orig.shape
            lw.set(orig, new, a)
        return Outcome.HANDLED


class Concat(Rule):
    """Concat requantizes every input to one type (the following QuantizeLinear's, or the widest)."""

    pattern = Op("Concat")

    def check(self, lw, m):
        if all(lw.get(t) is None for t in m.root.inputs):
            return "no input is quantized"
        return lw.missing(*m.root.inputs, const_ok=True)

    def rewrite(self, lw, m):
        node = m.root
        t = lw.target(node.outputs[0])
        if t is None:  # one shared input type passes through, else the widest at a scale holding them all
            t = qparams.concat_type(
                [lw.per_tensor(*lw.get(x))[1] for x in node.inputs if lw.get(x) is not None]
            )
        ints = [lw.requantize(*lw.operand(x), t, "concat_in") for x in node.inputs]
        out = lw.node("Concat", ints, t.dtype, "concat", attrs=node.attrs, shape=node.outputs[0].shape)
        lw.set(node.outputs[0], out, t)
        return Outcome.HANDLED


class Shape(Rule):
    """Shape of a lowered tensor reads the integer tensor (same shape); the node stays."""

    pattern = Op("Shape")

    def rewrite(self, lw, m):
        node = m.root
        got = lw.get(node.inputs[0])
        if got is not None:
            node.inputs[0] = got[0]
        else:  # the shape of a float graph input is the shape of its quantized copy
            q = next((c for c in node.inputs[0].outputs if c.op == "QuantizeLinear"), None)
            if q is not None:
                node.inputs[0] = q.outputs[0]
        return Outcome.KEPT


class Cast(Rule):
    """A float→float Cast of a lowered value is the identity on its integers; other Casts stay."""

    pattern = Op("Cast")

    def check(self, lw, m):
        dt = m.root.outputs[0].dtype
        if lw.get(m.root.inputs[0]) is not None and (dt is None or np.dtype(dt).kind != "f"):
            return "a Cast of a quantized tensor to a non-float type"
        return None

    def rewrite(self, lw, m):
        got = lw.get(m.root.inputs[0])
        if got is None:
            return Outcome.KEPT
        lw.set(m.root.outputs[0], *got)
        return Outcome.HANDLED
