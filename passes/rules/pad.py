"""Pad (Swin's window padding) in integers: the same Pad on the integers, padding with the zero point (16-bit
integers widened to int32 first: onnxruntime's Pad has no 16-bit kernel).

A constant pad value ``v`` becomes the integer ``v / s + zp``; only values that are exactly on the grid
(0, the usual case, is the zero point) are taken, so the padded tensor means what the float one does.
Pads computed from constants (TorchScript's ``F.pad``) are folded to a constant (TVM needs one).
"""

from __future__ import annotations

import numpy as np

from ivit_onnx.affine import Affine, dtype_range

from ..pattern import Op, Rule
from .consts import constant_value
from .lowerer import Lowerer, Outcome


def _pad_integer(lw: Lowerer, node) -> int | str:
    """The integer pad value, or why the Pad cannot be lowered."""
    got = lw.get(node.inputs[0])
    if got is None:
        return "input is not quantized"
    if node.attrs.get("mode", "constant") != "constant":
        return f"mode {node.attrs['mode']!r} (only constant padding)"
    if len(node.inputs) < 2:
        return "no pads input (opset < 11)"
    value = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
    v = lw.const_float(value) if value is not None else np.zeros(())
    if v is None or v.size != 1:
        return "pad value not a scalar constant"
    _, a = lw.per_tensor(*got)
    q = float(v.reshape(())) / float(a.scale) + a.zero_point
    lo, hi = dtype_range(a.dtype)
    if abs(q - round(q)) > 1e-6 or not lo <= round(q) <= hi:
        return f"pad value {float(v.reshape(()))} is not on the integer grid of {a.describe()}"
    return int(round(q))


class PadRule(Rule):
    """``Pad(x, pads, v)`` (constant mode) → ``Pad(q, pads, v/s + zp)``."""

    pattern = Op("Pad")
    label = "Pad (zero point)"

    def check(self, lw: Lowerer, m) -> str | None:
        q = _pad_integer(lw, m.root)
        return q if isinstance(q, str) else None

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        q = _pad_integer(lw, node)
        it, a = lw.per_tensor(*lw.get(node.inputs[0]))
        if a.dtype.itemsize == 2:  # onnxruntime's Pad has no 16-bit kernel: the same integers in int32
            it = lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
            a = Affine(a.scale, a.zero_point, np.int32, a.bound)
        extra = list(node.inputs[3:4]) if len(node.inputs) > 3 else []
        pads = constant_value(node.inputs[1], lw.ctx.opset)  # constant pads for TVM, whose Pad needs them
        pads = node.inputs[1] if pads is None else lw.const(pads.astype(np.int64), "pads")
        out = lw.node(
            "Pad",
            [it, pads, lw.zp(q, a.dtype, "value"), *extra],
            a.dtype,
            "pad",
            attrs={"mode": "constant"},
            shape=node.outputs[0].shape,
        )
        lw.set(node.outputs[0], out, a)
        lw.ctx.count("lower_integer", self.label)
        return Outcome.HANDLED
