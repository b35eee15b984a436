"""fuse_layernorm: collapse decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div/...) into LayerNormalization.

``(x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps) * gamma + beta`` over the last axis; ``Mul(d, d)``
for the square, ``Mul`` by ``Reciprocal`` for the division, and a missing gamma or beta also match.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .pattern import Const, FusePass, OneOf, Op, Rule, Var, last_axis, reduce_axes


class DecomposedLayerNorm(Rule):
    x = Var("x")
    d = Op("Sub", x, Op("ReduceMean", x, name="mean"))
    var = Op("ReduceMean", OneOf(Op("Pow", d, Const(2.0)), Op("Mul", d, d)), name="var")
    std = Op("Sqrt", Op("Add", var, Const(name="eps")))
    norm = OneOf(Op("Div", d, std), Op("Mul", d, Op("Reciprocal", std)))
    gamma, beta = Const(name="gamma"), Const(name="beta")
    pattern = OneOf(
        Op("Add", Op("Mul", norm, gamma), beta), Op("Mul", norm, gamma), Op("Add", norm, beta), norm
    )
    label = "LayerNorm (decomposed)"

    def check(self, ctx, m):
        if not all(last_axis(reduce_axes(r), r.inputs[0]) for r in (m.mean, m.var)):
            return "ReduceMean not over the last axis"
        if m.eps.size != 1:
            return "epsilon is not a scalar"
        if self.channels(m) is None:
            return "the channel count is unknown"
        return None

    @staticmethod
    def channels(m) -> int | None:
        c = m.x.shape[-1] if m.x.shape else None
        return c if isinstance(c, int) else m.gamma.size if "gamma" in m else None

    def rewrite(self, ctx, m):
        c, out = self.channels(m), m.root.outputs[0].name
        gamma = np.broadcast_to(m.gamma, (c,)) if "gamma" in m else np.ones(c)
        beta = np.broadcast_to(m.beta, (c,)) if "beta" in m else np.zeros(c)
        consts = [
            gs.Constant(f"{out}_{k}", np.ascontiguousarray(v, np.float32))
            for k, v in (("gamma", gamma), ("beta", beta))
        ]
        return "LayerNormalization", [m.x, *consts], {"axis": -1, "epsilon": float(m.eps.reshape(()))}


class FuseLayerNorm(FusePass):
    name, suffix = "fuse_layernorm", "ln"
    guarantees = ("layernorm_fused",)
    rules = (DecomposedLayerNorm(),)
