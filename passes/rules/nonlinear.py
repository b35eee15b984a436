"""Softmax / Gelu / LayerNormalization → Shiftmax / ShiftGELU / ILayerNorm from the input's own scale.

Each writes its output directly in the type of the QuantizeLinear that follows it where that is exact
(Shiftmax: a power-of-two scale; ShiftGELU/ILayerNorm requantize inside), else in a default type that
the following QuantizeLinear requantizes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.dyadic import multiplier_bits
from ivit_onnx.opset.shift_exp import max_n

from .lowerer import Lowerer, Outcome

_SOFTMAX_DEFAULT_BITS = 16
#: ShiftExp multiplies by 1.0111b = 1.4375 for log2(e); choosing x0 = 1.4375 / (log2(e) * s) instead of the
#: paper's round(1/s) cancels that 0.36 % slope error exactly (up to x0's rounding, < 0.05 % for x0 >= 1024)
_LOG2E_FIX = 1.4375 / math.log2(math.e)


def _last_dim(t: gs.Tensor) -> int | None:
    if t.shape is None or not t.shape or not isinstance(t.shape[-1], int):
        return None
    return int(t.shape[-1])


def _is_last_axis(node: gs.Node, axis_default: int) -> bool:
    axis = node.attrs.get("axis", axis_default)
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    return axis == -1 or (rank is not None and axis == rank - 1)


def _fine_grid(lw: Lowerer, it, a: Affine, x0_real: float):
    """Upscale the integers exactly (``q * m``) until ``1/scale`` reaches ``min_x0``; returns it, a, x0."""
    m = max(1, math.ceil(lw.opt.min_x0 / x0_real))
    if m > 1:
        t = Affine(a.scale / m, 0, np.int32, bound=min(a.bound * m, 2**31 - 1))
        if a.bound * m >= 2**31:
            m = max(1, (2**31 - 1) // max(a.bound, 1))
            t = Affine(a.scale / m, 0, np.int32, bound=a.bound * m)
        if m > 1:
            it = lw.private(
                "Requantize",
                [
                    it,
                    lw.zp(a.zero_point, a.dtype, "x_zp"),
                    lw.const(np.int64(m), "mult"),
                    lw.const(np.int64(0), "shift"),
                    lw.zp(0, np.int32, "y_zp"),
                ],
                np.int32,
                "upscale",
                qmin=-(2**31),
                qmax=2**31 - 1,
            )
            a = t
    return it, a, x0_real * m


def softmax(lw: Lowerer, node: gs.Node) -> Outcome:
    got = lw.get(node.inputs[0])
    if got is None or not _is_last_axis(node, -1 if lw.ctx.opset >= 13 else 1):
        return Outcome.FLOAT
    it, a = lw.per_tensor(*got)
    it, a, x0r = _fine_grid(lw, it, a, _LOG2E_FIX / float(a.scale))
    x0 = int(round(x0r))
    row = _last_dim(node.inputs[0]) or lw.opt.max_row
    n = max_n(x0, row)
    t = lw.target(node.outputs[0])
    bits = None
    if t is not None and t.per_tensor:
        k = -math.log2(float(t.scale))
        lo, hi = t.qrange
        if (
            abs(k - round(k)) < 1e-9
            and 1 <= round(k) <= 30
            and t.zero_point >= lo
            and t.zero_point + 2 ** round(k) - 1 <= hi
        ):
            bits = round(k)
    if bits is None:
        bits = _SOFTMAX_DEFAULT_BITS
        t = Affine(np.float64(2.0**-bits), 0, np.int32, bound=2**bits)
    out = lw.private(
        "Shiftmax",
        [it, lw.zp(t.zero_point, t.dtype, "y_zp")],
        t.dtype,
        "shiftmax",
        shape=node.outputs[0].shape,
        x0=x0,
        n=n,
        bits=bits,
    )
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED


def gelu(lw: Lowerer, node: gs.Node) -> Outcome:
    got = lw.get(node.inputs[0])
    if got is None:
        return Outcome.FLOAT
    it, a = lw.symmetric(*lw.per_tensor(*got))
    s = float(a.scale)
    it, a, x0r = _fine_grid(lw, it, a, _LOG2E_FIX / (1.702 * s))
    x0 = int(round(x0r))
    n = max_n(x0, 1)
    bits = lw.opt.gelu_bits
    t = lw.target(node.outputs[0]) or Affine(a.scale, 0, np.int32, bound=a.bound)
    b, c = lw.dyadic(float(a.scale) * 2.0**-bits / t.scale, multiplier_bits(a.bound << bits), "GELU rescale")
    lo, hi = t.qrange
    out = lw.private(
        "ShiftGELU",
        [it, lw.const(b, "mult"), lw.const(c, "shift"), lw.zp(t.zero_point, t.dtype, "y_zp")],
        t.dtype,
        "shiftgelu",
        shape=node.outputs[0].shape,
        x0=x0,
        n=n,
        bits=bits,
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
    gamma = np.broadcast_to(gamma.astype(np.float64).reshape(-1), (c_len,))
    beta = np.zeros(c_len) if beta is None else np.broadcast_to(beta.astype(np.float64).reshape(-1), (c_len,))
    # C * (2 * bound * 2**shift_in)**2 < 2**62  (|x - floor(mean)| <= 2 * bound)
    room = 61 - c_len.bit_length() - 2 * (2 * max(a.bound, 1)).bit_length()
    shift_in = max(0, min(room // 2, 16))
    if room < 0:  # too wide an input for exact variance: shift it down first (LayerNorm is scale-free)
        k = (-room + 1) // 2 + 1
        it = lw.requantize(it, a, Affine(a.scale * 2.0**k, 0, np.int32, bound=(a.bound >> k) + 1), "ln_in")
    p = lw.opt.ln_fraction_bits
    t = lw.target(node.outputs[0])
    if t is None:
        top = float(np.max(np.abs(gamma))) * math.sqrt(c_len) + float(np.max(np.abs(beta)))
        t = Affine(np.float64(top / 32767 if top > 0 else 1.0), 0, np.int16)
    mult = math.sqrt(c_len) * gamma / (2.0**p * float(t.scale))
    shifted_beta = beta / float(t.scale)
    b = np.zeros(c_len, np.int64)
    c = np.zeros(c_len, np.int64)
    # |u| <= 2**p, and the bias is |beta/s_y / m| times the multiplier: each channel's multiplier width
    # leaves room for both, so 2**p |b| + |bias| + 2**(c-1) < 2**62
    with np.errstate(divide="ignore"):
        ratio = np.where(mult != 0, np.abs(shifted_beta) / np.abs(mult), np.inf)
    bits = np.array(
        [61 - ((1 << p) + math.ceil(r) + 1).bit_length() if np.isfinite(r) else 0 for r in ratio]
    )
    bits = np.minimum(bits, 31)
    for w in np.unique(bits[bits >= 8]):  # channels with |gamma| negligible next to beta keep b = 0
        sel = bits == w
        b[sel], c[sel] = lw.dyadic(mult[sel], int(w), "LayerNorm gamma multiplier", allow_negative=True)
    bias = np.rint(np.ldexp(shifted_beta, c)).astype(np.int64)
    lo, hi = dtype_range(t.dtype)
    out = lw.private(
        "ILayerNorm",
        [
            it,
            lw.const(b, "mult"),
            lw.const(c, "shift"),
            lw.const(bias, "bias"),
            lw.zp(t.zero_point, t.dtype, "y_zp"),
        ],
        t.dtype,
        "ilayernorm",
        shape=node.outputs[0].shape,
        shift_in=shift_in,
        p=p,
        qmin=lo,
        qmax=hi,
    )
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED
