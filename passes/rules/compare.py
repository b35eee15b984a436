"""Comparisons and arg-selections of quantized tensors: their outputs, booleans or indices, are integers.

- ArgMax / ArgMin: ``(q - zp) * s`` is increasing in ``q`` (``s > 0``), so the index of the extreme integer is
  the index of the extreme value, ties included (the first, or the last with ``select_last_index``); 16-bit
  inputs are widened to int32 for onnxruntime's kernel.
- Equal / Greater / GreaterOrEqual / Less / LessOrEqual of a quantized tensor and a scalar constant: an
  8- or 16-bit input takes at most 65536 values, so the result is a boolean table indexed by ``q``, computed
  by the fake-quant subgraph itself in onnxruntime (DequantizeLinear, then the comparison in float32: equal to
  the fake-quant model on every input, float rounding included), then a ``Gather``.
- The same comparisons of two tensors of one integer type (one scale and zero point): the integers compare as
  the values do.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import dtype_range
from ivit_onnx.graph import dequantized_const

from ..pattern import Op, Rule
from . import lookup
from .lowerer import Lowerer, Outcome

COMPARISONS = ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual")


class ArgExtreme(Rule):
    """ArgMax / ArgMin of a quantized tensor → the same op on its integers (int64 indices)."""

    pattern = Op(("ArgMax", "ArgMin"))

    def check(self, lw, m):
        return lw.missing(m.root.inputs[0])

    def rewrite(self, lw, m):
        node = m.root
        it, a = lw.per_tensor(*lw.get(node.inputs[0]))
        if a.dtype.itemsize == 2:  # onnxruntime's ArgMax/ArgMin take 8- and 32-bit integers
            it = lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
        lw.g.nodes.append(onnx_node(lw, node.op, [it], node.outputs[0], node.attrs))
        lw.ctx.count("lower_integer", f"{node.op} on the integers")
        return Outcome.HANDLED


def onnx_node(lw: Lowerer, op: str, inputs: list, output, attrs: dict):
    """A graph node writing the original output tensor (an integer already: indices or booleans)."""
    return gs.Node(op, lw.fresh(op.lower()), dict(attrs), list(inputs), [output])


def _table(lw: Lowerer, op: str, a, constant) -> np.ndarray:
    """``op(DQ_a(q), constant)`` for every ``q`` of ``a``'s type as onnxruntime computes the fake-quant graph
    (:func:`.lookup.fake_quant`, on a detached node of its own)."""
    node = gs.Node(op, inputs=[gs.Variable("x"), constant], outputs=[gs.Variable("y", dtype=np.bool_)])
    try:
        return lookup.fake_quant(lw, node, a, None, out_dtype=np.bool_)[1]
    finally:
        node.inputs.clear()  # the constant keeps only its graph readers
        node.outputs.clear()


class Compare(Rule):
    """A comparison of a quantized tensor with a scalar constant (a boolean table), or of two tensors of one
    integer type (the integers compared)."""

    pattern = Op(COMPARISONS)
    label = "comparison on the integers"

    def check(self, lw, m):
        x, y = m.root.inputs[:2]
        if lw.get(x) is not None and lw.get(y) is not None:
            a, b = lw.get(x)[1], lw.get(y)[1]
            same = a.dtype == b.dtype and a.zero_point == b.zero_point and np.array_equal(a.scale, b.scale)
            return None if same else "the two inputs have different integer types"
        got = next(((t, c) for t, c in ((x, y), (y, x)) if lw.get(t) is not None), None)
        if got is None:
            return f"input '{x.name}' is not quantized"
        value = dequantized_const(got[1])
        if value is None or value.size != 1:
            return f"input '{got[1].name}' is not a scalar constant"
        a = lw.get(got[0])[1]
        if not a.per_tensor or a.dtype.itemsize > 2:
            return f"input '{got[0].name}' is {a.describe()}: no table covers it"
        return None

    def rewrite(self, lw, m):
        node = m.root
        x, y = node.inputs[:2]
        if lw.get(x) is not None and lw.get(y) is not None:
            lw.g.nodes.append(onnx_node(lw, node.op, [lw.get(x)[0], lw.get(y)[0]], node.outputs[0], {}))
            lw.ctx.count("lower_integer", f"{node.op} of one integer type")
            return Outcome.HANDLED
        flipped = lw.get(x) is None  # constant first: the same table with the operands swapped
        t, c = (y, x) if flipped else (x, y)
        it, a = lw.get(t)
        op = {"Greater": "Less", "Less": "Greater", "GreaterOrEqual": "LessOrEqual",
              "LessOrEqual": "GreaterOrEqual"}.get(node.op, node.op) if flipped else node.op  # fmt: skip
        table = _table(lw, op, a, c)
        lo = dtype_range(a.dtype)[0]
        idx = lw.node("Cast", [it], np.int32, "index", attrs={"to": np.int32}, shape=it.shape)
        if lo:
            idx = lw.node("Sub", [idx, lw.const(np.array(lo, np.int32), "qmin")], np.int32, "offset")
        gather = onnx_node(lw, "Gather", [lw.const(table, "table"), idx], node.outputs[0], {"axis": 0})
        lw.g.nodes.append(gather)
        lw.ctx.count("lower_integer", f"{node.op} → boolean table (Gather)")
        return Outcome.HANDLED
