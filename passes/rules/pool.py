"""ReduceMean / GlobalAveragePool (Swin's final average pool) / AveragePool in integers: an int32 sum, the 1/N
folded into the scale.

``mean = sum(q - zp) * s / N`` exactly, so the sum of the centred integers carries the type
``(s / N, 0, int32)``; the QuantizeLinear after it requantizes once (one rounding, as everywhere). An
AveragePool's window sums are a depthwise ConvInteger with a kernel of ones (it pads with the zero point,
i.e. with real zeros: exact for ``count_include_pad=1`` or no padding, where every window divides by N).
"""

from __future__ import annotations

import numpy as np

from ivit_onnx import qparams
from ivit_onnx.affine import Affine

from ..pattern import Op, Rule, reduce_axes
from .lowerer import Lowerer, Outcome

_INT32_MAX = 2**31 - 1


def _axes(node) -> list[int] | None:
    """The averaged axes: a ReduceMean's (``[]``: all), a GlobalAveragePool's every axis after the channels
    (Hugging Face Swin's ``AdaptiveAvgPool1d(1)``); None when not known at conversion time."""
    if node.op == "ReduceMean":
        return reduce_axes(node)
    shape = node.inputs[0].shape
    return None if shape is None else list(range(2, len(shape)))


def _count(lw: Lowerer, node) -> int | str:
    """How many elements each mean averages (static dims), or why it cannot be known."""
    if lw.get(node.inputs[0]) is None:
        return "input is not quantized"
    axes, shape = _axes(node), node.inputs[0].shape
    if axes is None or shape is None:
        return "axes or input rank not known at conversion time"
    dims = [shape[a] for a in axes] if axes else list(shape)
    if not all(isinstance(d, int) for d in dims):
        return f"reduced dims {dims} unknown (not static)"
    return int(np.prod(dims))


class ReduceMeanRule(Rule):
    """``ReduceMean(x)`` / ``GlobalAveragePool(x)`` → ``ReduceSum(int32(x - zp))`` typed ``s/N``."""

    pattern = Op(("ReduceMean", "GlobalAveragePool"))

    def check(self, lw: Lowerer, m) -> str | None:
        n = _count(lw, m.root)
        if isinstance(n, str):
            return n
        _, a = lw.get(m.root.inputs[0])
        a = a if a.per_tensor else qparams.per_tensor(a)  # the type rewrite sums
        if n * a.bound > _INT32_MAX:
            return f"a sum of {n} values bounded by {a.bound} could overflow int32"
        return None

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        n = _count(lw, node)
        it, a = lw.symmetric(*lw.per_tensor(*lw.get(node.inputs[0])))
        if a.dtype != np.int32:
            it = lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
        axes = _axes(node)
        keep = int(node.attrs.get("keepdims", 1))  # GlobalAveragePool keeps them
        attrs, inputs = {"keepdims": keep}, [it]
        if axes and lw.ctx.opset < 13:  # ReduceSum takes its axes as an input from opset 13 on
            attrs["axes"] = list(axes)
        elif axes:
            inputs.append(lw.const(np.array(axes, np.int64), "axes"))
        out = lw.node("ReduceSum", inputs, np.int32, "sum", attrs=attrs, shape=node.outputs[0].shape)
        lw.set(node.outputs[0], out, Affine(a.scale / n, 0, np.int32, bound=n * a.bound))
        lw.ctx.count("lower_integer", f"{node.op} → ReduceSum (int32)")
        return Outcome.HANDLED


def _window(lw: Lowerer, node) -> int | str:
    """The elements each AveragePool window averages (one N for every window), or why there is none."""
    got, shape = lw.get(node.inputs[0]), node.inputs[0].shape
    if got is None:
        return "input is not quantized"
    if not got[1].per_tensor or got[1].dtype.itemsize != 1:
        return f"input is not 8-bit per tensor ({got[1].describe()})"
    if shape is None or len(shape) < 3 or not isinstance(shape[1], int):
        return "channel count not known at conversion time"
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    padded = any(node.attrs.get("pads", [])) or auto_pad not in ("NOTSET", "VALID")
    if padded and not node.attrs.get("count_include_pad", 0):
        return "padded windows average fewer elements at the edges (count_include_pad=0): N is not constant"
    if node.attrs.get("ceil_mode", 0):
        return "ceil_mode: the last windows average fewer elements"
    return int(np.prod(node.attrs["kernel_shape"]))


class AveragePoolRule(Rule):
    """``AveragePool(x)`` → depthwise ``ConvInteger(x, ones)`` (int32 window sums) typed ``s/N``."""

    pattern = Op("AveragePool")

    def check(self, lw: Lowerer, m) -> str | None:
        n = _window(lw, m.root)
        return n if isinstance(n, str) else None

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        n, (it, a) = _window(lw, node), lw.get(node.inputs[0])
        k, channels = list(node.attrs["kernel_shape"]), node.inputs[0].shape[1]
        ones = lw.const(np.ones([channels, 1, *k], np.int8), "ones")
        keep = ("auto_pad", "dilations", "kernel_shape", "pads", "strides")
        attrs = {key: v for key, v in node.attrs.items() if key in keep}
        attrs["group"] = channels
        out = lw.node("ConvInteger", [it, ones, lw.zp(a.zero_point, a.dtype, "x_zp")], np.int32, "window_sum",
                      attrs=attrs, shape=node.outputs[0].shape)
        lw.set(node.outputs[0], out, Affine(a.scale / n, 0, np.int32, bound=n * a.bound))
        lw.ctx.count("lower_integer", "AveragePool → ConvInteger window sums (int32)")
        return Outcome.HANDLED
