"""Elementwise functions with no shift-based kernel (BERT pooler's Tanh, Sigmoid) as a 256-entry table lookup.

An 8-bit input takes only 256 values, so ``Q(f(DQ(q)))`` is a table of the output type indexed by ``q``:
``Gather(table, int32(q) - qmin)``, integer-only, and equal to the fake-quant model wherever float32 ``f``
rounds the same here as in the runtime (the table is computed in float32, as the fake-quant graph computes
it). Wider inputs would need a table per 2**16 or more values and are declined.
"""

from __future__ import annotations

import numpy as np

from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.io import quantize

from ..pattern import Op, Rule
from .lowerer import Lowerer, Outcome

#: op type -> its float32 function
FUNCTIONS = {
    "Tanh": np.tanh,
    "Sigmoid": lambda x: (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32),
}


class TableLookup(Rule):
    """``f(x)`` of an 8-bit per-tensor ``x`` whose result is quantized → a lookup table (``Gather``)."""

    pattern = Op(tuple(FUNCTIONS))
    label = "table lookup (Gather)"

    def check(self, lw: Lowerer, m) -> str | None:
        x = m.root.inputs[0]
        if lw.missing(x):
            return lw.missing(x)
        _, a = lw.get(x)
        if a.dtype.itemsize != 1 or not a.per_tensor:
            return f"a table lookup needs an 8-bit per-tensor input, got {a.dtype.name}"
        if lw.target(m.root.outputs[0]) is None:
            return "its output is not quantized (a table needs the output's type)"
        return None

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        it, a = lw.get(node.inputs[0])
        t = lw.target(node.outputs[0])
        lo, hi = dtype_range(a.dtype)
        q = np.arange(lo, hi + 1, dtype=np.int64)
        x = ((q - a.zero_point) * np.float32(a.scale)).astype(np.float32)
        scale, zp = np.asarray(t.scale, np.float32), np.asarray(t.zero_point, t.dtype)
        table = quantize(FUNCTIONS[node.op](x), scale, zp, 0)
        idx = lw.node("Cast", [it], np.int32, "index", attrs={"to": np.int32}, shape=it.shape)
        if lo:
            offset = lw.const(np.array(lo, np.int32), "qmin")
            idx = lw.node("Sub", [idx, offset], np.int32, "offset", shape=it.shape)
        shape = node.outputs[0].shape
        out = lw.node("Gather", [lw.const(table, "table"), idx], t.dtype, "lookup", {"axis": 0}, shape=shape)
        bound = int(np.max(np.abs(table.astype(np.int64) - t.zero_point)))
        lw.set(node.outputs[0], out, Affine(t.scale, t.zero_point, t.dtype, bound=bound))
        lw.ctx.count("lower_integer", f"{node.op} → {self.label}")
        return Outcome.HANDLED
