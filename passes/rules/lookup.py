"""Elementwise functions with no shift-based kernel (BERT pooler's Tanh, Sigmoid) as a table lookup.

An 8-bit input takes only 256 values, so ``Q(f(DQ(q)))`` is a table of the output type indexed by ``q``:
``Gather(table, int32(q) - qmin)``, integer-only and equal to the fake-quant model wherever float32 ``f``
rounds the same here as in the runtime (the table is computed in float32, as the fake-quant graph computes
it). A wider input (an int32 accumulator NNCF leaves unquantized before the pooler's Tanh) is first
requantized to int16 over ``[-R, R]``, where ``f`` is flat to within ``2**-22`` beyond (``SATURATES``),
and looked up in a 65536-entry table: the input step ``R / 32767`` moves ``f`` by at most half of it
(``|f'| <= 1``), below half an output step for every 8-bit output. With no QuantizeLinear after it the output
is int16 over ``f``'s range (``1/32767``).
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
#: |x| beyond which each function is within 2**-22 of its limit (tanh(8) = 1 - 2.3e-7, sigmoid(16) = 1 - 1e-7)
SATURATES = {"Tanh": 8.0, "Sigmoid": 16.0}
#: the output type without a QuantizeLinear after the op: int16 over the function's range [-1, 1] / [0, 1]
_OWN_OUTPUT = Affine(np.float64(1 / 32767), 0, np.int16)


class TableLookup(Rule):
    """``f(x)`` → a lookup table (``Gather``); 8-bit inputs exactly, wider ones through an int16 requantize
    over ``f``'s non-flat range."""

    pattern = Op(tuple(FUNCTIONS))
    label = "table lookup (Gather)"

    def check(self, lw: Lowerer, m) -> str | None:
        x = m.root.inputs[0]
        return lw.missing(x)

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        it, a = lw.per_tensor(*lw.get(node.inputs[0]))
        if a.dtype.itemsize != 1:  # a 65536-entry table over [-R, R], saturating beyond
            r = SATURATES[node.op]
            t16 = Affine(np.float64(r / 32767), 0, np.int16)
            it, a = lw.requantize(it, a, t16, "table_in"), t16
        t = lw.target(node.outputs[0]) or _OWN_OUTPUT
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
