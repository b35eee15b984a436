"""fuse_softmax: collapse decomposed softmax ``exp(x - max(x)) / sum(exp(x - max(x)))`` into Softmax.

Matched from each Exp over the last axis; the max subtraction is optional (softmax is shift-invariant).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ivit_onnx.graph import consumers_through_qdq, producer, through_qdq
from ivit_onnx.pipeline import Context, Pass

from ._match import is_last_axis, reduce_axes, src


def _match(exp: gs.Node):
    x = exp.inputs[0]
    sub = src(x, "Sub")
    if sub is not None:
        mx = src(sub.inputs[1], "ReduceMax")
        if mx is not None and through_qdq(mx.inputs[0]) is through_qdq(sub.inputs[0]):
            x = sub.inputs[0]
    cons = consumers_through_qdq(exp.outputs[0])
    ops = sorted(c.op for c, _ in cons)
    if ops != ["Div", "ReduceSum"]:
        return None
    red = next(c for c, _ in cons if c.op == "ReduceSum")
    div = next(c for c, _ in cons if c.op == "Div")
    if not is_last_axis(reduce_axes(red), red.inputs[0]):
        return None
    if through_qdq(div.inputs[1]) is not red.outputs[0] or through_qdq(div.inputs[0]) is not exp.outputs[0]:
        return None
    return x, div.outputs[0]


class FuseSoftmax(Pass):
    name = "fuse_softmax"
    guarantees = ("softmax_fused",)

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        matches = [m for n in g.nodes if n.op == "Exp" and (m := _match(n)) is not None]
        for x, out in matches:
            producer(out).outputs.clear()
            g.nodes.append(
                gs.Node("Softmax", name=f"{out.name}_softmax", attrs={"axis": -1}, inputs=[x], outputs=[out])
            )
            ctx.count(self.name, "Softmax (decomposed)")
        if matches:
            g.cleanup().toposort()
        return bool(matches)
