"""Layout ops pass the affine type through: the same op runs on the integers (Reshape, Transpose, ...)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine

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
    "Split",
    "Expand",
    "Tile",
    "Identity",
    "Dropout",
    "MaxPool",
)


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


def pass_through(lw: Lowerer, node: gs.Node) -> Outcome:
    got = lw.operand(node.inputs[0])
    if got is None:
        return Outcome.FLOAT
    if node.op == "Transpose":
        return _transpose(lw, node, *got)
    it, a = lw.per_tensor(*got)
    rest = list(node.inputs[1:]) if node.op not in ("Dropout",) else []
    outs = lw.node(
        node.op,
        [it, *rest],
        a.dtype,
        node.op.lower(),
        attrs=node.attrs,
        n_out=len(node.outputs) if node.op != "Dropout" else 1,
    )
    outs = outs if isinstance(outs, list) else [outs]
    for orig, new in zip(node.outputs, outs, strict=False):
        new.shape = orig.shape
        lw.set(orig, new, a)
    return Outcome.HANDLED


def concat(lw: Lowerer, node: gs.Node) -> Outcome:
    ops = [lw.get(t) for t in node.inputs]
    if all(o is None for o in ops):
        return Outcome.FLOAT
    t = lw.target(node.outputs[0])
    if t is None:  # the widest input type, at the finest scale that still holds every input's range
        t = qparams.concat_type([lw.per_tensor(*o)[1] for o in ops if o is not None])
    ints = []
    for tensor, o in zip(node.inputs, ops, strict=True):
        o = o if o is not None else lw.operand(tensor)
        if o is None:
            return Outcome.FLOAT
        ints.append(lw.requantize(*o, t, "concat_in"))
    out = lw.node("Concat", ints, t.dtype, "concat", attrs=node.attrs, shape=node.outputs[0].shape)
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED


def shape(lw: Lowerer, node: gs.Node) -> Outcome:
    """Shape of a lowered tensor: read the integer tensor (same shape); the node stays."""
    got = lw.get(node.inputs[0])
    if got is not None:
        node.inputs[0] = got[0]
    else:  # the shape of a float graph input is the shape of its quantized copy
        q = next((c for c in node.inputs[0].outputs if c.op == "QuantizeLinear"), None)
        if q is not None:
            node.inputs[0] = q.outputs[0]
    return Outcome.KEPT


def cast(lw: Lowerer, node: gs.Node) -> Outcome:
    """A float→float Cast of a lowered value is the identity on its integers."""
    got = lw.get(node.inputs[0])
    if got is None or node.outputs[0].dtype is None or node.outputs[0].dtype.kind != "f":
        return Outcome.FLOAT if got is not None else Outcome.KEPT
    lw.set(node.outputs[0], *got)
    return Outcome.HANDLED
