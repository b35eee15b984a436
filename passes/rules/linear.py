"""MatMul / Gemm / Conv → MatMulInteger / ConvInteger (int8×int8→int32) with int32 bias.

The accumulator's type is ``s_x * s_w`` (per output channel when the weights are), zero point 0, and
its bound ``K * max|x| * max|w|`` sizes every later dyadic multiplier.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine
from ivit_onnx.graph import const_array

from ..pattern import Op, Rule
from .lowerer import Lowerer, Outcome, optional_input
from .qdq import float_weight

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
_INT32_MAX = 2**31 - 1


def _narrowed(lw: Lowerer, it, a: Affine, bits: int):
    """``it`` requantized so that ``|q| < 2**bits`` covers its whole bound (the same real range)."""
    qmax = 2**bits - 1
    if a.bound <= qmax:
        return it, a
    t = Affine(a.scale * (a.bound / qmax), 0, np.int16 if bits <= 15 else np.int32, bound=qmax + 1)
    return lw.requantize(it, a, t, "narrow"), t


def _fit_int32(lw: Lowerer, a_in, b_in, k: int):
    """Operands narrowed until ``k * max|a| * max|b|`` fits an int32 accumulator: wide operands (int32
    accumulators of unquantized activations, as PT2E and Brevitas leave attention matmuls) would wrap."""
    (_, a), (_, b) = a_in, b_in
    if (a.dtype in _EIGHT_BIT and b.dtype in _EIGHT_BIT) or (max(a.bound, b.bound) <= 2**15 and k is None):
        return a_in, b_in  # MatMulInteger, or the int16 operands this converter was first written for
    k = k or lw.opt.max_row  # unknown contraction length: the longest row the options allow
    if k * a.bound * b.bound <= _INT32_MAX:
        return a_in, b_in
    budget = int(np.floor(np.log2(_INT32_MAX / max(k, 1))))
    need_a, need_b = (max(1, int(x.bound).bit_length()) for x in (a, b))
    bits_a = min(need_a, max(budget - need_b, budget // 2))
    bits_b = min(need_b, budget - bits_a)
    lw.ctx.count("lower_integer", "operands narrowed to fit int32")
    return _narrowed(lw, *a_in, bits_a), _narrowed(lw, *b_in, bits_b)


def _tightened(t: Affine, a: Affine, ib, b: Affine) -> Affine:
    """A constant right operand bounds the accumulator by ``max|a| * max_j sum_k |w_kj|``, far below
    ``k * max|a| * max|w|``: later narrowing and rescaling keep more of the real range's bits."""
    w = const_array(ib) if isinstance(ib, gs.Constant) else None
    if w is None or w.ndim < 2:
        return t
    l1 = int(np.max(np.sum(np.abs(w.astype(np.int64) - b.zero_point), axis=-2), initial=0))
    return Affine(t.scale, t.zero_point, t.dtype, bound=min(t.bound, max(a.bound * l1, 1)))


def _integer_matmul(lw: Lowerer, a_in, b_in, k: int, hint: str, out_shape):
    (ia, a), (ib, b) = a_in, b_in
    if a.dtype in _EIGHT_BIT and b.dtype in _EIGHT_BIT:
        out = lw.node("MatMulInteger", [ia, ib, *_zero_points(lw, a, b)], np.int32, hint, shape=out_shape)
        lw.ctx.count("lower_integer", "MatMulInteger")
    else:  # 16-bit operands: exact int32 MatMul of zero-point-free operands
        ia, a = lw.symmetric(ia, a)
        ib, b = lw.symmetric(ib, b)
        ca = lw.node("Cast", [ia], np.int32, "cast_a", attrs={"to": np.int32})
        cb = lw.node("Cast", [ib], np.int32, "cast_b", attrs={"to": np.int32})
        out = lw.node("MatMul", [ca, cb], np.int32, hint, shape=out_shape)
        lw.ctx.count("lower_integer", "MatMul int32")
    return out, _tightened(qparams.accumulator(a, b, k), a, ib, b)


def _zero_points(lw: Lowerer, a: Affine, b: Affine) -> list:
    """The optional zero-point inputs of MatMulInteger/ConvInteger (b's only when it is non-zero)."""
    if not (a.zero_point or b.zero_point):
        return []
    return [lw.zp(a.zero_point, a.dtype, "a_zp")] + (
        [lw.zp(b.zero_point, b.dtype, "b_zp")] if b.zero_point else []
    )


def _finish(lw: Lowerer, node: gs.Node, out, t: Affine, bias_shape=(-1,), beta: float = 1.0) -> Outcome:
    """Add the bias input (if any, in int32), count the MACs and bind the output."""
    if optional_input(node, 2) is not None:
        bias = lw.const_float(node.inputs[2]).reshape(bias_shape) * beta
        out, t = add_bias(lw, out, t, bias, f"{node.op.lower()}_bias")
    lw.count_macs(node)
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED


def _weight_operand(lw: Lowerer, t: gs.Tensor):
    it, a = lw.get(t)
    if a.per_tensor:
        return it, a
    if isinstance(it, gs.Constant) and a.scale.ndim >= 1 and a.scale.shape[-1] == a.scale.size:
        return it, Affine(a.scale.reshape(-1), a.zero_point, a.dtype, a.bound)  # per column: broadcasts
    return lw.per_tensor(it, a)


class MatMul(Rule):
    """MatMul of two integer operands (the right one per column at most) → MatMulInteger or int32 MatMul."""

    pattern = Op("MatMul")

    def check(self, lw, m):
        return float_weight(lw, m.root) or lw.missing(*m.root.inputs[:2])

    def rewrite(self, lw, m):
        node = m.root
        a_in = lw.per_tensor(*lw.get(node.inputs[0]))
        b_in = _weight_operand(lw, node.inputs[1])
        shape_a, shape_b = a_in[0].shape, b_in[0].shape
        dims = ((shape_b or [None, None])[-2], (shape_a or [None])[-1])
        k = next((d for d in dims if isinstance(d, int)), None)
        a_in, b_in = _fit_int32(lw, a_in, b_in, k)
        return _finish(lw, node, *_integer_matmul(lw, a_in, b_in, k or 1, "matmul", node.outputs[0].shape))


def add_bias(lw: Lowerer, it: gs.Tensor, a: Affine, bias: np.ndarray, hint: str):
    """``acc + bias`` in int32, the bias rounded to the accumulator's scale (int32, as I-ViT)."""
    q, t = qparams.bias(a, bias)
    out = lw.node("Add", [it, lw.const(q, "bias")], np.int32, hint, shape=it.shape)
    lw.ctx.count("lower_integer", "bias Add (int32)")
    return out, t


def _weight_check(lw, node: gs.Node) -> str | None:
    """Why a Gemm/Conv cannot be lowered: a float or non-constant weight, an input, or a float bias."""
    why = float_weight(lw, node) or lw.missing(*node.inputs[:2])
    if why is None and not isinstance(lw.get(node.inputs[1])[0], gs.Constant):
        return f"weight '{node.inputs[1].name}' is not a constant"
    if why is None and optional_input(node, 2) is not None and lw.const_float(node.inputs[2]) is None:
        return f"bias '{node.inputs[2].name}' is not a constant"
    return why


class Gemm(Rule):
    """Gemm with a constant integer weight → MatMulInteger (+ int32 bias Add), alpha/beta folded."""

    pattern = Op("Gemm")

    def check(self, lw, m):
        return "transA is not supported" if m.root.attrs.get("transA", 0) else _weight_check(lw, m.root)

    def rewrite(self, lw, m):
        node = m.root
        ib, b = lw.get(node.inputs[1])
        w, scale = const_array(ib), b.scale
        if node.attrs.get("transB", 0):
            w = w.T
            scale = scale.reshape(-1) if scale.size > 1 else scale
        b_in = (lw.const(np.ascontiguousarray(w), "weight"), Affine(scale, b.zero_point, b.dtype, b.bound))
        a_in, b_in = _fit_int32(lw, lw.per_tensor(*lw.get(node.inputs[0])), b_in, w.shape[0])
        out, t = _integer_matmul(lw, a_in, b_in, w.shape[0], "gemm", node.outputs[0].shape)
        t = t.scaled(float(node.attrs.get("alpha", 1.0)))
        return _finish(lw, node, out, t, beta=float(node.attrs.get("beta", 1.0)))


class Conv(Rule):
    """Conv of 8-bit per-tensor input and constant 8-bit weight → ConvInteger (+ int32 bias Add)."""

    pattern = Op("Conv")

    def check(self, lw, m):
        why = _weight_check(lw, m.root)
        if why is None:
            x, w = (lw.get(t)[1] for t in m.root.inputs[:2])
            if x.dtype not in _EIGHT_BIT or not x.per_tensor or w.dtype not in _EIGHT_BIT:
                return f"operands are not 8-bit, per-tensor input and weight ({x.dtype}, {w.dtype})"
        return why

    def rewrite(self, lw, m):
        node = m.root
        (ix, x), (iw, w) = lw.get(node.inputs[0]), lw.get(node.inputs[1])
        wv, zps = const_array(iw), _zero_points(lw, x, w)
        keep = ("dilations", "group", "kernel_shape", "pads", "strides", "auto_pad")
        attrs = {k: v for k, v in node.attrs.items() if k in keep}
        out = lw.node(
            "ConvInteger", [ix, iw, *zps], np.int32, "conv", attrs=attrs, shape=node.outputs[0].shape
        )
        lw.ctx.count("lower_integer", "ConvInteger")
        nd = wv.ndim - 2
        t = qparams.conv_accumulator(x, w, int(np.prod(wv.shape[1:])), nd)
        return _finish(lw, node, out, t, bias_shape=[-1] + [1] * nd)
