"""fuse_l2norm: collapse ``F.normalize(x, p=2, dim=-1)`` (and ``x / x.norm(dim=-1, keepdim=True)``) into
``LpNormalization(axis=-1, p=2)``.

The exporters' forms: TorchScript and dynamo both write ``Div(x, Expand(Clip(ReduceL2(x), eps), shape))``;
hand-written ones use ``Sqrt(ReduceSum(x*x))`` or ``Pow(x, 2)``, ``Max`` for the clamp, ``Mul`` by a
``Reciprocal``, or no clamp. LpNormalization has no ``eps``: it equals ``x / max(||x||, eps)`` exactly when
``eps`` is at most the input's quantization step (a non-zero row of multiples of ``s`` has norm ``>= s``, and
both give 0 on a zero row), which the rule checks (or, where the input has no DequantizeLinear, e.g. a pooled
mean computed in integers, ``rules/l2norm.py`` once the input's type is known); ``lower_integer`` turns the
marker into IL2Norm.
"""

from __future__ import annotations

import numpy as np

from ivit_onnx.graph import const_array, producer

from .pattern import Const, FusePass, OneOf, Op, Rule, Var, last_axis, reduce_axes

#: ``ctx.notes`` key: the output -> ``eps`` of the fused normalizations whose input has no DequantizeLinear
#: (its integer type, and so its step, is known only when ``lower_integer`` reaches it)
EPS_NOTE = "l2norm_eps"
#: ops whose output holds a subset of the values of their data input 0 (the input's scale carries over)
LAYOUT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Slice", "Split", "Flatten",
                    "Identity", "Expand"})


def input_step(t) -> float | None:
    """The smallest quantization step of ``t``: its DequantizeLinear's scale, through layout ops."""
    node = producer(t)
    while node is not None and node.op in LAYOUT:
        node = producer(node.inputs[0])
    if node is None or node.op != "DequantizeLinear":
        return None
    scale = const_array(node.inputs[1])
    return None if scale is None or scale.size == 0 else float(np.min(scale))


class L2Normalize(Rule):
    x = Var("x")
    square = OneOf(Op("Pow", x, Const(2.0)), Op("Mul", x, x))
    norm = OneOf(Op("ReduceL2", x, name="reduce"), Op("Sqrt", Op("ReduceSum", square, name="reduce")))
    eps = Const(name="eps")
    clamped = OneOf(Op("Clip", norm, eps, name="clip"), Op("Max", norm, eps), norm)
    denominator = OneOf(Op("Expand", clamped), clamped)
    pattern = OneOf(Op("Div", x, denominator), Op("Mul", x, Op("Reciprocal", denominator)))
    label = "L2 normalization (F.normalize)"

    def check(self, ctx, m):
        r = m.reduce
        if not last_axis(reduce_axes(r), m.x) or not r.attrs.get("keepdims", 1):
            return f"{r.op} not over the last axis with keepdims"
        if "clip" in m and len(m.clip.inputs) > 2 and m.clip.inputs[2].name:
            return "the norm's Clip has a maximum"
        if "eps" in m:
            if m.eps.size != 1:
                return "epsilon is not a scalar"
            step = input_step(m.x)
            eps = float(m.eps.reshape(()))
            if step is None:  # computed in integers (a pooled mean): the lowering checks its step
                ctx.notes.setdefault(EPS_NOTE, {})[m.root.outputs[0].name] = eps
            elif eps > step:
                return f"epsilon {eps:.3g} exceeds the input's quantization step {step:.3g}"
        return None

    def rewrite(self, ctx, m):
        return "LpNormalization", [m.x], {"axis": -1, "p": 2}


class FuseL2Norm(FusePass):
    name, suffix = "fuse_l2norm", "l2norm"
    guarantees = ("l2norm_fused",)
    rules = (L2Normalize(),)
