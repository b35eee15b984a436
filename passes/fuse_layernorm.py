"""fuse_layernorm: collapse decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div/...) into LayerNormalization.

Matched from each Sqrt: ``(x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps) * gamma + beta`` over the
last axis (``Mul(d, d)`` for the square and ``Mul`` by ``Reciprocal`` for the division also match).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.graph import consumers_through_qdq, dequantized_const, producer, scalar_const, through_qdq
from ivit_onnx.pipeline import Context, Pass

from ._match import is_last_axis, other_input, reduce_axes, src


def _square_of(t: gs.Tensor) -> gs.Tensor | None:
    p = src(t, ("Pow", "Mul"))
    if p is None:
        return None
    if p.op == "Pow":
        return p.inputs[0] if scalar_const(p.inputs[1]) == 2.0 else None
    a, b = through_qdq(p.inputs[0]), through_qdq(p.inputs[1])
    return p.inputs[0] if a is b else None


def _match(sqrt: gs.Node):
    add = src(sqrt.inputs[0], "Add")
    if add is None:
        return None
    eps = (
        scalar_const(add.inputs[1])
        if scalar_const(add.inputs[1]) is not None
        else scalar_const(add.inputs[0])
    )
    var_t = add.inputs[0] if scalar_const(add.inputs[1]) is not None else add.inputs[1]
    var = src(var_t, "ReduceMean")
    if eps is None or var is None or not is_last_axis(reduce_axes(var), var.inputs[0]):
        return None
    d = _square_of(var.inputs[0])
    sub = src(d, "Sub") if d is not None else None
    if sub is None:
        return None
    mean = src(sub.inputs[1], "ReduceMean")
    x = sub.inputs[0]
    if mean is None or through_qdq(mean.inputs[0]) is not through_qdq(x):
        return None
    # normalized = d / sqrt  or  d * (1 / sqrt)
    cons = consumers_through_qdq(sqrt.outputs[0])
    if len(cons) != 1:
        return None
    node, _ = cons[0]
    if node.op == "Reciprocal":
        cons = consumers_through_qdq(node.outputs[0])
        if len(cons) != 1 or cons[0][0].op != "Mul":
            return None
        node = cons[0][0]
    elif node.op != "Div":
        return None
    out, gamma, beta = node.outputs[0], None, None
    for op in ("Mul", "Add"):
        nxt = consumers_through_qdq(out)
        if len(nxt) != 1 or nxt[0][0].op != op:
            break
        val = dequantized_const(other_input(nxt[0][0], nxt[0][1]))
        if val is None:
            break
        gamma, beta = (val, beta) if op == "Mul" else (gamma, val)
        out = nxt[0][0].outputs[0]
    return x, out, float(eps), gamma, beta


class FuseLayerNorm(Pass):
    name = "fuse_layernorm"
    guarantees = ("layernorm_fused",)

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        matches = [m for n in g.nodes if n.op == "Sqrt" and (m := _match(n)) is not None]
        for x, out, eps, gamma, beta in matches:
            c = x.shape[-1] if x.shape is not None and isinstance(x.shape[-1], int) else None
            size = c if c is not None else (gamma.size if gamma is not None else None)
            if size is None:
                continue
            gamma = np.ones(size, np.float32) if gamma is None else np.broadcast_to(gamma, (size,))
            beta = np.zeros(size, np.float32) if beta is None else np.broadcast_to(beta, (size,))

            producer(out).outputs.clear()
            g.nodes.append(
                gs.Node(
                    "LayerNormalization",
                    name=f"{out.name}_ln",
                    attrs={"axis": -1, "epsilon": eps},
                    inputs=[
                        x,
                        gs.Constant(f"{out.name}_gamma", np.ascontiguousarray(gamma, np.float32)),
                        gs.Constant(f"{out.name}_beta", np.ascontiguousarray(beta, np.float32)),
                    ],
                    outputs=[out],
                )
            )
            ctx.count(self.name, "LayerNorm (decomposed)")
        if matches:
            g.cleanup().toposort()
        return bool(matches)
