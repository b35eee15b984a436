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
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.affine import dtype_range
from ivit_onnx.graph import dequantized_const

from ..pattern import Op, Rule
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
    import onnx_graphsurgeon as gs

    return gs.Node(op, lw.fresh(op.lower()), dict(attrs), list(inputs), [output])


def _table(lw: Lowerer, op: str, a, value: np.ndarray) -> np.ndarray:
    """``op(DQ_a(q), value)`` for every ``q`` of ``a``'s type as onnxruntime computes the fake-quant graph."""
    import onnxruntime as ort

    from ivit_onnx.runners import simulate_qdq

    lo, hi = dtype_range(a.dtype)
    q = np.arange(lo, hi + 1, dtype=np.int64).astype(a.dtype)
    ttype = helper.np_dtype_to_tensor_dtype
    inits = [
        numpy_helper.from_array(np.asarray(a.scale, np.float32).reshape(()), "s"),
        numpy_helper.from_array(np.array(a.zero_point, a.dtype), "zp"),
        numpy_helper.from_array(np.asarray(value, np.float32).reshape(()), "c"),
    ]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["x"]),
         helper.make_node(op, ["x", "c"], ["y"])],
        "compare", [helper.make_tensor_value_info("q", ttype(a.dtype), [q.size])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.BOOL, [q.size])], inits,
    )
    opset = [helper.make_opsetid("", max(21, lw.ctx.opset))]
    model = helper.make_model(graph, opset_imports=opset, ir_version=10)
    opts = ort.SessionOptions()
    simulate_qdq(opts)
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"q": q})[0]


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
        table = _table(lw, op, a, dequantized_const(c))
        lo = dtype_range(a.dtype)[0]
        idx = lw.node("Cast", [it], np.int32, "index", attrs={"to": np.int32}, shape=it.shape)
        if lo:
            idx = lw.node("Sub", [idx, lw.const(np.array(lo, np.int32), "qmin")], np.int32, "offset")
        gather = onnx_node(lw, "Gather", [lw.const(table, "table"), idx], node.outputs[0], {"axis": 0})
        lw.g.nodes.append(gather)
        lw.ctx.count("lower_integer", f"{node.op} → boolean table (Gather)")
        return Outcome.HANDLED
