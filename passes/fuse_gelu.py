"""fuse_gelu: collapse decomposed GELU (erf and tanh forms, any Mul order, Q/DQ pairs inside; CLIP's
quick_gelu ``x * sigmoid(1.702 x)``) into Gelu.

The fused node is the standard ``Gelu`` (``approximate`` "none"/"tanh"), an in-pipeline marker that
``lower_integer`` turns into ShiftGELU; Q/DQ pairs ORT placed inside the pattern are dropped with it.
:func:`unfuse` turns a Gelu left as a float island back into standard ops where the opset lacks Gelu.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.graph import detach, producer

from .pattern import Const, FusePass, OneOf, Op, Rule, Var

x = Var("x")


def _half_x_times(one_plus: Op) -> OneOf:
    """``0.5 * x * one_plus`` in any association (``x * one_plus / 2`` too)."""
    half_x = OneOf(Op("Mul", x, Const(0.5)), Op("Div", x, Const(2.0)))
    return OneOf(
        Op("Mul", Op("Mul", x, one_plus), Const(0.5)),
        Op("Div", Op("Mul", x, one_plus), Const(2.0)),
        Op("Mul", Op("Mul", one_plus, Const(0.5)), x),
        Op("Mul", half_x, one_plus),
    )


class ErfGelu(Rule):
    arg = OneOf(Op("Div", x, Const(math.sqrt(2))), Op("Mul", x, Const(math.sqrt(0.5))))
    pattern = _half_x_times(Op("Add", Op("Erf", arg), Const(1.0)))
    label, form = "GELU (erf form)", "none"

    def rewrite(self, ctx, m):
        return "Gelu", [m.x], {"approximate": self.form}


class TanhGelu(ErfGelu):
    cube = OneOf(Op("Mul", x, Op("Mul", x, x)), Op("Pow", x, Const(3.0)))
    arg = Op("Mul", Op("Add", x, Op("Mul", cube, Const(0.044715))), Const(math.sqrt(2 / math.pi)))
    pattern = _half_x_times(Op("Add", Op("Tanh", arg), Const(1.0)))
    label, form = "GELU (tanh form)", "tanh"


class QuickGelu(ErfGelu):
    """CLIP's quick_gelu ``x * sigmoid(1.702 x)``: I-ViT's ShiftGELU computes exactly this (its sigmoid
    argument is ``1.702 x``), so the fused Gelu under the default ``--gelu`` is a closer match to quick_gelu
    than to erf-GELU (the two differ by up to 0.0204; ``--gelu ibert`` approximates erf-GELU). Fused only
    where ``x`` is quantized: a Gelu left as a float island would compute erf-GELU instead."""

    pattern = Op("Mul", x, Op("Sigmoid", Op("Mul", x, Const(1.702))))
    label = "GELU (quick_gelu: x * sigmoid(1.702 x))"

    def check(self, ctx, m):
        p = producer(m.x)
        return None if p is not None and p.op == "DequantizeLinear" else "x * sigmoid(1.702 x) of a float x"


class FuseGelu(FusePass):
    name, suffix = "fuse_gelu", "gelu"
    guarantees = ("gelu_fused",)
    rules = (ErfGelu(), TanhGelu(), QuickGelu())


def unfuse(g: gs.Graph, node: gs.Node) -> None:
    """A Gelu marker left as a float island in a pre-opset-20 model goes back to standard ops."""
    x, out = node.inputs[0], node.outputs[0]
    detach(node)

    def op(kind, *inputs, name):
        ins = [
            gs.Constant(f"{out.name}/{name}_c", np.array(i, np.float32)) if isinstance(i, float) else i
            for i in inputs
        ]
        return g.layer(op=kind, inputs=ins, outputs=[out if name == "out" else f"{out.name}/{name}"])[0]

    if node.attrs.get("approximate", "none") == "tanh":
        x3 = op("Mul", x, op("Mul", x, x, name="x2"), name="x3")
        inner = op("Add", x, op("Mul", x3, 0.044715, name="kx3"), name="in")
        t = op("Tanh", op("Mul", inner, float(np.sqrt(2 / np.pi)), name="arg"), name="t")
    else:
        t = op("Erf", op("Div", x, float(np.sqrt(2.0)), name="arg"), name="t")
    op("Mul", op("Mul", x, 0.5, name="hx"), op("Add", t, 1.0, name="1p"), name="out")
