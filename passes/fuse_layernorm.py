"""fuse_layernorm: collapse decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div/...) into LayerNormalization.

``(x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps) * gamma + beta`` over one axis, as exporters and
quantizers leave it: ``Mul(d, d)`` or ``Pow(d, 2)`` (float or integer 2) for the square, ``x - mean`` once or
twice, ``Div``, ``Mul`` by ``Reciprocal`` or ``1 / std`` for the division, a missing gamma or beta, and Q/DQ
pairs on any edge inside (onnxruntime's quantizer puts them there; the fused node reads the first DQ'd ``x``
and the Q after the last op quantizes its output: the integer ILayerNorm is the definition of LayerNorm
here, so the intermediate pairs are dropped). Over an axis other than the last (``quant_pre_process`` pushes
a Transpose through a LayerNorm, leaving its reductions over the axis the Transpose later moves last; a
channels-first LayerNorm) the fused node is wrapped in the two Transposes that make that axis the last.
``eps`` outside the square root is not a LayerNorm and is declined.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from .pattern import Const, FusePass, OneOf, Op, Rule, Var, reduce_axes


class DecomposedLayerNorm(Rule):
    x = Var("x")
    mean = Op("ReduceMean", x, name="mean")
    d, d2 = Op("Sub", x, mean), Op("Sub", x, mean)  # the numerator's and the variance's (not CSE'd) x - mean
    var = Op("ReduceMean", OneOf(Op("Pow", d2, Const(2.0)), Op("Mul", d2, d2)), name="var")
    std = OneOf(
        Op("Sqrt", Op("Add", var, Const(name="eps"))), Op("Add", Op("Sqrt", var), Const(name="eps_outside"))
    )
    norm = OneOf(Op("Div", d, std), Op("Mul", d, OneOf(Op("Reciprocal", std), Op("Div", Const(1.0), std))))
    gamma, beta = Const(name="gamma"), Const(name="beta")
    pattern = OneOf(
        Op("Add", Op("Mul", norm, gamma), beta), Op("Mul", norm, gamma), Op("Add", norm, beta), norm
    )
    label = "LayerNorm (decomposed)"

    def check(self, ctx, m):
        axes = [self.axis(r) for r in (m.mean, m.var)]
        if None in axes or axes[0] != axes[1]:
            return "ReduceMean over different, several or unknown axes (or keepdims=0)"
        if "eps_outside" in m:
            return "epsilon added outside the square root: not a LayerNorm"
        if m.eps.size != 1:
            return "epsilon is not a scalar"
        if self.channels(m) is None:
            return "the channel count is unknown"
        if axes[0] != -1 and not m.x.shape:
            return "not over the last axis, and the rank is unknown"
        for k in ("gamma", "beta"):
            if k in m and self.per_channel(m[k], m, axes[0]) is None:
                return f"{k} varies along another axis than the normalized one"
        return None

    @staticmethod
    def axis(node: gs.Node) -> int | None:
        """The one axis a keepdims ReduceMean reduces, counted from the end (-1 the last), else None."""
        axes, rank = reduce_axes(node), len(node.inputs[0].shape) if node.inputs[0].shape else None
        if axes is None or len(axes) != 1 or not node.attrs.get("keepdims", 1):
            return None
        if axes[0] < 0:
            return axes[0]
        return axes[0] - rank if rank is not None else None

    def channels(self, m) -> int | None:
        shape, axis = m.x.shape, self.axis(m.mean)
        c = shape[axis] if shape and len(shape) >= -axis else None
        return c if isinstance(c, int) else m.gamma.size if "gamma" in m and m.gamma.size > 1 else None

    def per_channel(self, v: np.ndarray, m, axis: int) -> np.ndarray | None:
        """``v`` (gamma or beta, broadcast against ``x``) as one value per channel, or None when it varies
        along another axis."""
        shape = (1,) * max(0, -axis - v.ndim) + v.shape
        if any(n != 1 for i, n in enumerate(shape[::-1], 1) if i != -axis):
            return None
        return np.broadcast_to(v.reshape(-1), (self.channels(m),))

    def rewrite(self, ctx, m):
        c, out, axis = self.channels(m), m.root.outputs[0].name, self.axis(m.mean)
        gamma = self.per_channel(m.gamma, m, axis) if "gamma" in m else np.ones(c)
        beta = self.per_channel(m.beta, m, axis) if "beta" in m else np.zeros(c)
        consts = [
            gs.Constant(f"{out}_{k}", np.ascontiguousarray(v, np.float32))
            for k, v in (("gamma", gamma), ("beta", beta))
        ]
        attrs = {"axis": -1, "epsilon": float(m.eps.reshape(()))}
        if axis == -1:
            return "LayerNormalization", [m.x, *consts], attrs
        # the normalized axis moved last, and back: the Transposes are integer layout ops after lowering
        rank = len(m.x.shape)
        perm = [i for i in range(rank) if i != rank + axis] + [rank + axis]
        shape = [m.x.shape[i] for i in perm]
        moved = gs.Variable(f"{out}_ln_in", np.float32, shape)
        normed = gs.Variable(f"{out}_ln_out", np.float32, shape)
        ctx.graph.nodes += [
            gs.Node("Transpose", f"{out}_to_last", {"perm": perm}, [m.x], [moved]),
            gs.Node("LayerNormalization", f"{out}_last_axis", attrs, [moved, *consts], [normed]),
        ]
        return "Transpose", [normed], {"perm": [int(i) for i in np.argsort(perm)]}


class FuseLayerNorm(FusePass):
    name, suffix = "fuse_layernorm", "ln"
    guarantees = ("layernorm_fused",)
    rules = (DecomposedLayerNorm(),)
