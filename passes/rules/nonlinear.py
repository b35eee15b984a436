"""Softmax / Gelu / LayerNormalization → Shiftmax / ShiftGELU / ILayerNorm from the input's own scale.

Each writes its output directly in the type of the QuantizeLinear that follows it where that is exact
(Shiftmax: a power-of-two scale; ShiftGELU/ILayerNorm requantize inside), else in a default type that
the following QuantizeLinear requantizes.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine, dtype_range

from .lowerer import Lowerer, Outcome


def _last_dim(t: gs.Tensor) -> int | None:
    if t.shape is None or not t.shape or not isinstance(t.shape[-1], int):
        return None
    return int(t.shape[-1])


def _is_last_axis(node: gs.Node, axis_default: int) -> bool:
    axis = node.attrs.get("axis", axis_default)
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    return axis == -1 or (rank is not None and axis == rank - 1)


def _upscale(lw: Lowerer, it, a: Affine, up: qparams.Upscale):
    """The exact ``q * m`` Requantize of :func:`ivit_onnx.qparams.fine_grid` (nothing when ``m == 1``)."""
    if up.m == 1:
        return it
    return lw.private(
        "Requantize",
        [
            it,
            lw.zp(a.zero_point, a.dtype, "x_zp"),
            lw.const(np.int64(up.m), "mult"),
            lw.const(np.int64(0), "shift"),
            lw.zp(0, np.int32, "y_zp"),
        ],
        np.int32,
        "upscale",
        qmin=-(2**31),
        qmax=2**31 - 1,
    )


def softmax(lw: Lowerer, node: gs.Node) -> Outcome:
    got = lw.get(node.inputs[0])
    if got is None or not _is_last_axis(node, -1 if lw.ctx.opset >= 13 else 1):
        return Outcome.FLOAT
    it, a = lw.per_tensor(*got)
    row = _last_dim(node.inputs[0]) or lw.opt.max_row
    sp = qparams.shiftmax(a, row, lw.target(node.outputs[0]), lw.opt.min_x0)
    it, t = _upscale(lw, it, a, sp.up), sp.t
    out = lw.private(
        "Shiftmax",
        [it, lw.zp(t.zero_point, t.dtype, "y_zp")],
        t.dtype,
        "shiftmax",
        shape=node.outputs[0].shape,
        x0=sp.x0,
        n=sp.n,
        bits=sp.bits,
    )
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED


def gelu(lw: Lowerer, node: gs.Node) -> Outcome:
    got = lw.get(node.inputs[0])
    if got is None:
        return Outcome.FLOAT
    it, a = lw.symmetric(*lw.per_tensor(*got))
    gp = qparams.shiftgelu(a, lw.target(node.outputs[0]), lw.opt.min_x0, lw.opt.gelu_bits, lw.dyadic)
    it, t = _upscale(lw, it, a, gp.up), gp.t
    lo, hi = t.qrange
    out = lw.private(
        "ShiftGELU",
        [
            it,
            lw.const(gp.multiplier, "mult"),
            lw.const(gp.shift, "shift"),
            lw.zp(t.zero_point, t.dtype, "y_zp"),
        ],
        t.dtype,
        "shiftgelu",
        shape=node.outputs[0].shape,
        x0=gp.x0,
        n=gp.n,
        bits=gp.bits,
        qmin=lo,
        qmax=hi,
    )
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED


def layernorm(lw: Lowerer, node: gs.Node) -> Outcome:
    got = lw.get(node.inputs[0])
    gamma = lw.const_float(node.inputs[1]) if len(node.inputs) > 1 else None
    beta = lw.const_float(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
    c_len = _last_dim(node.inputs[0])
    if got is None or gamma is None or c_len is None or not _is_last_axis(node, -1):
        return Outcome.FLOAT
    it, a = got
    lp = qparams.layernorm(
        a, c_len, gamma, beta, lw.target(node.outputs[0]), lw.opt.ln_fraction_bits, lw.dyadic
    )
    if lp.pre is not None:
        it = lw.requantize(it, a, lp.pre, "ln_in")
    t = lp.t
    lo, hi = dtype_range(t.dtype)
    out = lw.private(
        "ILayerNorm",
        [
            it,
            lw.const(lp.multiplier, "mult"),
            lw.const(lp.shift, "shift"),
            lw.const(lp.bias, "bias"),
            lw.zp(t.zero_point, t.dtype, "y_zp"),
        ],
        t.dtype,
        "ilayernorm",
        shape=node.outputs[0].shape,
        shift_in=lp.shift_in,
        p=lp.p,
        qmin=lo,
        qmax=hi,
    )
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED
