"""fuse_softmax: collapse decomposed softmax ``exp(x - max(x)) / sum(exp(x - max(x)))`` into Softmax.

The max subtraction is optional (softmax is shift-invariant); the sum must run over the last axis.
"""

from __future__ import annotations

from .pattern import FusePass, OneOf, Op, Rule, Var, last_axis, reduce_axes


class DecomposedSoftmax(Rule):
    x = Var("x")
    exp = Op("Exp", OneOf(Op("Sub", x, Op("ReduceMax", x, name="max")), x), name="exp")
    pattern = Op("Div", exp, Op("ReduceSum", exp, name="sum"))
    label = "Softmax (decomposed)"

    def check(self, ctx, m):
        if not last_axis(reduce_axes(m.sum), m.sum.inputs[0]):
            return "ReduceSum not over the last axis"
        return None

    def rewrite(self, ctx, m):
        row_max = "max" in m and last_axis(reduce_axes(m.max), m.max.inputs[0])
        return "Softmax", [m.x if row_max else m.exp.inputs[0]], {"axis": -1}


class FuseSoftmax(FusePass):
    name, suffix = "fuse_softmax", "softmax"
    guarantees = ("softmax_fused",)
    rules = (DecomposedSoftmax(),)
