"""QuantizeLinear lowered so that no compiler flag can change its result (CUDA fast math included).

TVM legalizes ``relax.quantize`` to ``round(x / s) + zp``: a float32 division, which ``--use_fast_math``
(TVM's default CUDA flags) turns into an approximate one, off by one LSB in ~2 per million elements of
DeiT's input. Here the quotient is computed in float64 and rounded to float32: fast math leaves float64
division exact (``div.rn.f64``), and rounding the float64 quotient of two float32 values to float32 gives
the correctly rounded float32 quotient (double rounding is innocuous for division when 53 >= 2*24 + 2), so
the result equals onnxruntime's ``x / s`` bit for bit on every target. Flush-to-zero could only matter for
subnormal ``x`` with ``s < 2**-125`` (else ``|x / s| < 0.5`` rounds to 0 either way); such scales are
rejected. Everything after the quotient (round half to even, add the zero point, clip, cast) is exact.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx
from tvm.relax.transform.legalize_ops.common import _try_convert_to_scalar_const
from tvm.relax.transform.legalize_ops.qdq import _quantize, clip_cast

#: the smallest scale for which flush-to-zero of a subnormal input cannot change the rounded quotient
MIN_SCALE = 2.0**-125


def _param(p, indices, axis):
    """A quantization parameter at ``indices``: a scalar constant, a singleton tensor or per-axis."""
    if isinstance(p, tirx.IntImm | tirx.FloatImm):
        return p
    if all(isinstance(d, tirx.IntImm) and d.value == 1 for d in p.shape):
        return p[(0,) * len(p.shape)]
    return p[indices[axis]]


def _check_scale(expr) -> None:
    """Raise if a constant scale is below :data:`MIN_SCALE` (or not positive)."""
    if isinstance(expr, tvm.ir.GenericConst):
        s = expr.value.numpy()
        if s.size and not np.all(s >= MIN_SCALE):
            raise ValueError(f"QuantizeLinear scale {s.min()!r} below 2**-125: exactness on GPUs not proven")


def exact_quantize(bb: tvm.relax.BlockBuilder, call: tvm.relax.Call) -> tvm.relax.Expr:
    """Legalize ``relax.quantize`` of float32 input with the quotient taken in float64 (see module doc)."""
    data, scale, zp = call.args
    if str(data.ty.dtype) != "float32" or "int" not in str(call.attrs.out_dtype):
        return _quantize(bb, call)  # not the float -> integer quantize this module is about
    _check_scale(scale)
    axis, out_dtype = int(call.attrs.axis), str(call.attrs.out_dtype)
    if axis < 0:
        axis += data.ty.ndim

    def compute(x: te.Tensor, s, z):
        def element(*idx):
            s_val = _param(s, idx, axis).astype("float64")
            quotient = (x[idx].astype("float64") / s_val).astype("float32")
            return clip_cast(te.round(quotient) + _param(z, idx, axis).astype("float32"), out_dtype)

        return te.compute(x.shape, element, name="quantized")

    # the scale stays a tensor read at run time: TVM's CUDA codegen prints float64 literals with 15 digits
    return bb.call_te(compute, data, scale, _try_convert_to_scalar_const(zp), primfunc_name_hint="quantize")


#: ``customize_legalize_map`` for :class:`tvm.relax.transform.LegalizeOps`
LEGALIZE = {"relax.quantize": exact_quantize}

__all__ = ["LEGALIZE", "MIN_SCALE", "exact_quantize"]
