"""BatchNormalization (inference) of a quantized tensor in integers: after a Conv, a Gemm or a MatMul (LeViT's
BatchNorm after a Linear), or on its own.

BatchNorm is the per-channel affine ``y = k*x + b`` with ``k = gamma/sqrt(var + eps)`` and
``b = beta - k*mean``. With ``x = s*q`` (``q`` centred; ``s`` per tensor or per channel, as a GEMM's int32
accumulator is), ``y = (|k|*s/2**p) * (sign(k)*2**p*q) + b``: an exact int32 product of the integers by
``sign(k)*2**p`` (a negative ``gamma`` flips the channel's sign, ``gamma = 0`` zeroes it) with the positive
per-channel scale ``|k|*s/2**p``, then ``b`` added in int32 at that scale. ``p`` is the largest shift that
keeps the sum in int32, so the bias rounding (at most half of ``|k|*s/2**p``) is far below any output step;
the QuantizeLinear after it is the one Requantize (per-channel multipliers): within one output step of the
fake-quant graph. Whatever Q/DQ sit between the GEMM and the BatchNorm, the rule reads the typed integers.
"""

from __future__ import annotations

import numpy as np

from ivit_onnx import qparams
from ivit_onnx.affine import Affine

from ..pattern import Op, Rule
from .lowerer import Lowerer, Outcome

_INT32_MAX = 2**31 - 1
#: finer than this the bias rounding gains nothing (2**-16 of the input step)
_MAX_SHIFT = 16


def _params(lw: Lowerer, node) -> tuple[np.ndarray, np.ndarray] | str:
    """``(k, b)`` per channel, or why the node cannot be lowered."""
    if node.attrs.get("training_mode", 0) or len([t for t in node.outputs if t.name]) > 1:
        return "training mode (running statistics as outputs)"
    if lw.get(node.inputs[0]) is None:
        return "input is not quantized"
    shape = node.inputs[0].shape
    if shape is None or len(shape) < 2 or not isinstance(shape[1], int):
        return "channel count not known at conversion time"
    gamma, beta, mean, var = (lw.const_float(t) for t in node.inputs[1:5])
    if any(v is None for v in (gamma, beta, mean, var)):
        return "scale, bias, mean and variance must be constants"
    eps = float(node.attrs.get("epsilon", 1e-5))
    gamma, beta, mean, var = (np.asarray(v, np.float64).reshape(-1) for v in (gamma, beta, mean, var))
    if not all(v.size in (1, shape[1]) for v in (gamma, beta, mean, var)):
        return f"parameters do not have the {shape[1]} channels of the input"
    k = gamma / np.sqrt(var + eps)
    b = beta - k * mean
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(b))):
        return "parameters are not finite"
    return np.broadcast_to(k, (shape[1],)), np.broadcast_to(b, (shape[1],))


class BatchNorm(Rule):
    """``BatchNormalization(x)`` → ``x * (sign(k)*2**p) + round(b / step)`` in int32, typed per channel."""

    pattern = Op("BatchNormalization")

    def check(self, lw: Lowerer, m) -> str | None:
        got = _params(lw, m.root)
        if isinstance(got, str):
            return got
        rank = len(m.root.inputs[0].shape)
        _, a = lw.get(m.root.inputs[0])
        if not a.per_tensor and _channel_scale(a, got[0].size, rank) is None:
            a = qparams.per_tensor(a)
        if _shift(_coarse(a, *got, rank), *got, rank) is None:
            return "the bias does not fit int32"
        return None

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        k, b = _params(lw, node)
        rank = len(node.inputs[0].shape)
        it, a = lw.get(node.inputs[0])
        if not a.per_tensor and _channel_scale(a, k.size, rank) is None:
            it, a = lw.per_tensor(it, a)  # per channel along another axis than the BatchNorm's
        t = _coarse(a, k, b, rank)
        if t is not a:  # a bias far beyond the input's range: the input's last bits do not matter
            it, a = lw.requantize(it, a, t, "coarse"), t
        it, a = lw.symmetric(it, a)
        if a.dtype != np.int32:
            it = lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
        p, step, sign = _shift(a, k, b, rank)
        cshape = [k.size] + [1] * (rank - 2)
        mult = (sign * (1 << p)).astype(np.int32).reshape(cshape)
        out = it
        if np.any(mult != 1):
            out = lw.node("Mul", [it, lw.const(mult, "bn_mult")], np.int32, "bn_scale", shape=it.shape)
        bias = np.rint(b / step).astype(np.int32)
        out = lw.node("Add", [out, lw.const(bias.reshape(cshape), "bn_bias")], np.int32, "bn_bias",
                      shape=node.outputs[0].shape)
        bound = min(a.bound * (1 << p) + int(np.max(np.abs(bias), initial=0)), _INT32_MAX)
        lw.set(node.outputs[0], out, Affine(step.reshape(cshape), 0, np.int32, bound=bound))
        lw.ctx.count("lower_integer", "BatchNormalization → int32 Mul + Add")
        return Outcome.HANDLED


def _channel_scale(a: Affine, channels: int, rank: int) -> np.ndarray | None:
    """The input's scale per BatchNorm channel (axis 1), None when it varies along another axis."""
    if a.scale.ndim > rank:
        return None
    full = (1,) * (rank - a.scale.ndim) + a.scale.shape
    if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, channels):
        return None
    return np.broadcast_to(a.scale.reshape(-1), (channels,))


def _need(a: Affine, k: np.ndarray, b: np.ndarray, rank: int) -> float:
    """The int32 range ``|q| + |b|/step`` the sum needs at ``p = 0``."""
    s = _channel_scale(a, k.size, rank)
    return a.bound + float(np.max(np.abs(b) / (np.where(k == 0, 1.0, np.abs(k)) * s), initial=0)) + 1


def _coarse(a: Affine, k: np.ndarray, b: np.ndarray, rank: int) -> Affine:
    """``a``, or where the sum would not fit int32 (a bias beyond ``2**31`` input steps), ``a`` at a coarser
    step with the sum within ``2**30``."""
    need = _need(a, k, b, rank)
    if need <= _INT32_MAX:
        return a
    f = need / 2**30
    return Affine(a.scale * f, 0, np.int32, bound=int(np.ceil(a.bound / f)) + 1)


def _shift(a: Affine, k: np.ndarray, b: np.ndarray, rank: int):
    """``(p, step, sign)``: the largest ``p <= 16`` whose int32 sum ``|q|*2**p + |b|/step`` fits, the
    per-channel output step ``|k|*s/2**p`` (a zeroed channel keeps ``s/2**p``), ``sign(k)``; None if none
    fits."""
    mag = np.where(k == 0, 1.0, np.abs(k)) * _channel_scale(a, k.size, rank)
    need = _need(a, k, b, rank)
    if need > _INT32_MAX:
        return None
    p = min(_MAX_SHIFT, int(np.floor(np.log2(_INT32_MAX / need))))
    return p, mag / (1 << p), np.sign(k).astype(np.int64)
