"""A small builder for the ops' ONNX function bodies, in standard integer ops only.

It encodes the engine rules of FACTS.md once: no signed BitShift (powers of two come from a uint64
shift), no integer Pow, floor division of signed values as ``(a - Mod(a, d)) / d`` (Div truncates),
and ReduceMax/ReduceSum axes in the form the model's opset version expects.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

I64 = TensorProto.INT64


class Body:
    """Accumulates the nodes of one FunctionProto; every method returns the name of its output."""

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """Append one node; returns its (single) output."""
        name = out or self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def const(self, value, dtype=np.int64) -> str:
        """A constant tensor (scalar or array) of ``dtype``."""
        arr = np.asarray(value, dtype=dtype)
        name = self._name("const")
        self.nodes.append(
            helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(arr, name))
        )
        return name

    def attr_int(self, attr: str) -> str:
        """An int64 scalar tensor holding the function attribute ``attr`` (a ``ref_attr_name`` Constant)."""
        name = self._name(attr)
        node = helper.make_node("Constant", [], [name])
        ref = helper.make_attribute_ref("value_int", onnx.AttributeProto.INT)
        ref.ref_attr_name = attr
        node.attribute.append(ref)
        self.nodes.append(node)
        return name

    def i64(self, x: str) -> str:
        return self.op("Cast", x, to=I64)

    def pow2(self, c: str) -> str:
        """``2**c`` as int64 for int64 ``0 <= c <= 62`` (uint64 left shift: signed BitShift is not allowed)."""
        one = self.const(1, np.uint64)
        shifted = self.op("BitShift", one, self.op("Cast", c, to=TensorProto.UINT64), direction="LEFT")
        return self.i64(shifted)

    def floor_div(self, a: str, d: str) -> str:
        """``floor(a / d)`` for int64 ``a`` and positive ``d``: Mod (fmod=0) has the divisor's sign."""
        return self.op("Div", self.op("Sub", a, self.op("Mod", a, d)), d)

    def round_shift(self, t: str, c: str) -> str:
        """``floor((t + floor(2**c / 2)) / 2**c)``: the one rounding rule (round half up) of every rescale."""
        p = self.pow2(c)
        half = self.op("Div", p, self.const(2))
        return self.floor_div(self.op("Add", t, half), p)

    def saturate(self, y: str, like: str, out: str | None = None) -> str:
        """Clip int64 ``y`` to ``[qmin, qmax]`` (attributes) and cast to the type of ``like``."""
        clipped = self.op("Clip", y, self.attr_int("qmin"), self.attr_int("qmax"))
        return self.op("CastLike", clipped, like, out=out)

    def _reduce(self, op_type: str, x: str, attr_axes_until: int) -> str:
        if self.opset < attr_axes_until:
            return self.op(op_type, x, axes=[-1], keepdims=1)
        return self.op(op_type, x, self.const([-1]), keepdims=1)

    def reduce_max(self, x: str) -> str:
        """Max over the last axis, kept (ReduceMax takes axes as an input from opset 18)."""
        return self._reduce("ReduceMax", x, 18)

    def reduce_sum(self, x: str) -> str:
        """Sum over the last axis, kept (ReduceSum takes axes as an input from opset 13)."""
        return self._reduce("ReduceSum", x, 13)

    def function(
        self, domain: str, name: str, inputs: list[str], outputs: list[str], attributes: list[str]
    ) -> onnx.FunctionProto:
        return helper.make_function(
            domain, name, inputs, outputs, self.nodes, [helper.make_opsetid("", self.opset)], attributes
        )
