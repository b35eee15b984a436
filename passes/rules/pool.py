"""ReduceMean / GlobalAveragePool (Swin's final average pool) in integers: an int32 ReduceSum, the 1/N folded
into the scale.

``mean = sum(q - zp) * s / N`` exactly, so the sum of the centred integers carries the type
``(s / N, 0, int32)``; the QuantizeLinear after it requantizes once (one rounding, as everywhere).
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
        return f"reduced dims {dims} not static"
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
