"""A small builder for the ops' ONNX function bodies, in standard integer ops only.

It encodes the engine rules (measured on onnxruntime 1.31, TVM 0.27 and onnx.reference; listed in
opset/README.md, "Function bodies") once: no signed BitShift (powers of two come from a uint64
shift), no integer Pow, floor division of signed values as a biased uint64 shift (by powers of two) or
``(a - Mod(a, d)) / d`` (Div truncates), and ReduceMax/ReduceSum axes in the form the model's opset
version expects.

onnxruntime 1.31's int64 Max, Min, Clip, ReduceMax and ReduceMin are wrong on this AVX-512 CPU for
values with ``2**31 <= |v| < 2**32`` in tensors of more than one element (e.g. ``Clip(-2687724265,
-128, 127)`` returns ``-2687724265``; Less/Greater/Where are right). So the elementwise max/min of
int64 values are built as ``Where(Less(a, b), b, a)`` (:meth:`Body.maximum`, :meth:`Body.minimum`),
saturation too, and ReduceMax is only applied to int64 values that fit int32 (inputs cast up).
Its int64 ReduceSum goes through double: sums beyond ``2**53`` are rounded (``[2**53, 1]`` sums to
``2**53``) and overflow saturates. Large non-negative sums are therefore split at ``2**32``
(:meth:`Body.reduce_sum_exact`), so every ReduceSum stays below ``2**53``.
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
        """``2**c`` as int64 for int64 ``0 <= c <= 62``, by a uint64 left shift (no signed BitShift)."""
        one = self.const(1, np.uint64)
        shifted = self.op("BitShift", one, self.op("Cast", c, to=TensorProto.UINT64), direction="LEFT")
        return self.i64(shifted)

    def floor_div(self, a: str, d: str) -> str:
        """``floor(a / d)`` for int64 ``a`` and positive ``d``: Mod (fmod=0) has the divisor's sign."""
        return self.op("Div", self.op("Sub", a, self.op("Mod", a, d)), d)

    def floor_shift(self, t: str, c: str) -> str:
        """``floor(t / 2**c)`` for int64 ``-2**62 <= t < 2**62`` and ``0 <= c <= 62``, without a division.

        ``t + 2**62`` is non-negative and fits int64, so its uint64 right shift is a floor; subtracting
        ``2**(62-c)`` removes the bias. Several times faster than ``(t - Mod(t, d)) / d`` in onnxruntime
        (int64 Mod and Div do not vectorize), and it keeps every constant below ``2**63`` (TVM mishandles
        larger uint64 constants).
        """
        u64 = TensorProto.UINT64
        biased = self.op("Cast", self.op("Add", t, self.const(1 << 62)), to=u64)
        shifted = self.i64(self.op("BitShift", biased, self.op("Cast", c, to=u64), direction="RIGHT"))
        return self.op("Sub", shifted, self.pow2(self.op("Sub", self.const(62), c)))

    def shift_nonneg(self, t: str, c: str) -> str:
        """``floor(t / 2**c)`` for int64 ``t >= 0``: a plain uint64 right shift."""
        u64 = TensorProto.UINT64
        return self.i64(self.op("BitShift", self.op("Cast", t, to=u64), self.op("Cast", c, to=u64),
                                direction="RIGHT"))

    def round_shift(self, t: str, c: str) -> str:
        """``floor((t + floor(2**c / 2)) / 2**c)``: the one rounding rule (round half up) of every rescale."""
        half = self.op("Div", self.pow2(c), self.const(2))
        return self.floor_shift(self.op("Add", t, half), c)

    def maximum(self, a: str, b: str) -> str:
        """Elementwise max of int64 ``a``, ``b``: ``Where(Less(a, b), b, a)`` (not Max: module doc)."""
        return self.op("Where", self.op("Less", a, b), b, a)

    def minimum(self, a: str, b: str) -> str:
        """Elementwise min of int64 ``a``, ``b``: ``Where(Less(b, a), b, a)`` (not Min: module doc)."""
        return self.op("Where", self.op("Less", b, a), b, a)

    def requantize_out(self, t: str) -> str:
        """The tail of every requantizing op: ``y = saturate(round_shift(t, shift) + y_zero_point)``."""
        y = self.op("Add", self.round_shift(t, "shift"), self.i64("y_zero_point"))
        return self.saturate(y, "y_zero_point", out="y")

    def saturate(self, y: str, like: str, out: str | None = None) -> str:
        """Clip int64 ``y`` to ``[qmin, qmax]`` (attributes) and cast to the type of ``like``.

        The clip is :meth:`maximum` then :meth:`minimum`, not Clip (wrong on int64 in onnxruntime 1.31).
        """
        clipped = self.minimum(self.maximum(y, self.attr_int("qmin")), self.attr_int("qmax"))
        return self.op("CastLike", clipped, like, out=out)

    def _reduce(self, op_type: str, x: str, attr_axes_until: int) -> str:
        if self.opset < attr_axes_until:
            return self.op(op_type, x, axes=[-1], keepdims=1)
        return self.op(op_type, x, self.const([-1]), keepdims=1)

    def reduce_max(self, x: str) -> str:
        """Max over the last axis, kept (ReduceMax takes axes as an input from opset 18).

        Only for int64 values within int32's range (onnxruntime 1.31's int64 ReduceMax is wrong beyond).
        """
        return self._reduce("ReduceMax", x, 18)

    def reduce_sum(self, x: str) -> str:
        """Sum over the last axis, kept (ReduceSum takes axes as an input from opset 13).

        Exact only while every partial sum stays below ``2**53`` (onnxruntime sums int64 in double).
        """
        return self._reduce("ReduceSum", x, 13)

    def reduce_sum_exact(self, x: str) -> str:
        """Exact last-axis sum of non-negative int64 ``x`` (sum below ``2**63``, rows below ``2**21``).

        ``x = h * 2**32 + l`` with ``0 <= l < 2**32``: both partial ReduceSums stay below ``2**53``.
        """
        p32 = self.const(1 << 32)
        hi = self.op("Div", x, p32)  # x >= 0: truncation is floor
        lo = self.op("Sub", x, self.op("Mul", hi, p32))
        return self.op("Add", self.op("Mul", self.reduce_sum(hi), p32), self.reduce_sum(lo))

    def function(
        self, domain: str, name: str, inputs: list[str], outputs: list[str], attributes: list[str]
    ) -> onnx.FunctionProto:
        return helper.make_function(
            domain, name, inputs, outputs, self.nodes, [helper.make_opsetid("", self.opset)], attributes
        )
