"""Run models on the numpy reference kernels: onnx.reference with the private ops bound to them.

onnx 1.23's reference runtime has no DequantizeLinear before opset 19 (and its QuantizeLinear-10
accepts no per-axis scales), so for models whose default opset is below 19 both are bound here with
the ONNX opset-13 semantics (:class:`QuantizeLinear`, :class:`DequantizeLinear`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ivit_onnx.io import default_opset

from . import OPS
from ._spec import DOMAIN

#: default-domain opset from which onnx.reference's own QuantizeLinear/DequantizeLinear are complete
NATIVE_QDQ_OPSET = 19


def _op_class(spec):
    def _run(self, *inputs, **attrs):
        return (spec.reference(*inputs, **{k: int(v) for k, v in attrs.items()}),)

    attrs = {k: None for k in spec.attributes}
    return type(spec.name, (OpRun,), {"op_domain": DOMAIN, "_run": _run, **attrs})


_CLASSES = [_op_class(s) for s in OPS.values()]


def _per_axis(v: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    """A scalar as is, a 1-D per-axis parameter reshaped to broadcast along ``axis`` of ``x``."""
    v = np.asarray(v)
    if v.ndim == 0 or v.shape == (1,):  # a one-element vector is per-tensor (as onnxruntime reads it)
        return v.reshape(())
    if v.ndim != 1:
        raise ValueError(f"scale/zero point must be a scalar or 1-D, got shape {v.shape}")
    axis = axis % x.ndim
    if v.shape[0] != x.shape[axis]:
        raise ValueError(f"per-axis parameter of length {v.shape[0]} for axis {axis} of shape {x.shape}")
    shape = [1] * x.ndim
    shape[axis] = -1
    return v.reshape(shape)


class QuantizeLinear(OpRun):
    """ONNX QuantizeLinear-13: ``saturate(round_half_even(x / y_scale) + y_zero_point)``, float32 math."""

    op_domain = ""

    def _run(self, x, y_scale, y_zero_point=None, axis=1, **_later_opset_attrs):
        zp = np.zeros((), np.uint8) if y_zero_point is None else np.asarray(y_zero_point)
        if zp.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise TypeError(f"QuantizeLinear-13 zero point must be int8 or uint8, got {zp.dtype}")
        scale = _per_axis(y_scale, x, axis).astype(np.float32)
        q = np.rint(np.asarray(x).astype(np.float32) / scale).astype(np.float64)
        info = np.iinfo(zp.dtype)
        y = np.clip(q + _per_axis(zp, x, axis).astype(np.float64), info.min, info.max)
        return (y.astype(zp.dtype),)


class DequantizeLinear(OpRun):
    """ONNX DequantizeLinear-13: ``(x - x_zero_point) * x_scale``; exact difference, float32 product."""

    op_domain = ""

    def _run(self, x, x_scale, x_zero_point=None, axis=1, **_later_opset_attrs):
        x = np.asarray(x)
        if x_zero_point is not None and np.asarray(x_zero_point).dtype != x.dtype:
            zdt = np.asarray(x_zero_point).dtype
            raise TypeError(f"DequantizeLinear: zero point {zdt} != input {x.dtype}")
        zp = 0 if x_zero_point is None else _per_axis(x_zero_point, x, axis).astype(np.int64)
        diff = (x.astype(np.int64) - zp).astype(np.float32)
        scale = _per_axis(x_scale, x, axis)
        return ((diff * scale.astype(np.float32)).astype(np.asarray(x_scale).dtype),)


QDQ_CLASSES = [QuantizeLinear, DequantizeLinear]


def evaluator(model: onnx.ModelProto, **kwargs) -> ReferenceEvaluator:
    """A ReferenceEvaluator that executes ``ai.ivit`` nodes with the reference kernels (not the bodies).

    Below opset 19 the default-domain QuantizeLinear/DequantizeLinear are this module's.
    """
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    keep = [f for f in stripped.functions if f.domain != DOMAIN]
    del stripped.functions[:]
    stripped.functions.extend(keep)
    ops = list(_CLASSES)
    if default_opset(model) < NATIVE_QDQ_OPSET:
        ops += QDQ_CLASSES
    return ReferenceEvaluator(stripped, new_ops=ops, **kwargs)
