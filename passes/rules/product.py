"""Mul / Div of quantized tensors: an exact integer product, then one Requantize into the QuantizeLinear.

- ``x * k`` / ``x / k``, ``k`` a positive constant: the exact fold of :class:`.elementwise.ScaleByConst`
  (same integers, scale times ``k``), the cheapest form; used wherever it applies.
- ``x * k`` / ``x / k``, ``k`` a float constant of any sign and broadcast shape (a layer scale with negative
  entries, rotary sin/cos tables, a SmoothQuant Mul): ``k``'s magnitude goes into the scale, exactly
  (float64), only its sign into the integers, so the constant carries no quantization error: the value is
  ``(q - zx) sign(k)`` at scale ``s_x |k|`` (``|k|`` read as 1 where ``k = 0``). With a QuantizeLinear after
  it that is one Requantize with the signed per-element multiplier ``s_x k / s_t`` (0 where ``k = 0``);
  without one, the Requantize by ``sign(k)`` into int16 (int32 for wider inputs), exact, where that scale
  varies along at most one axis (a per-channel type every consumer reads); a scale varying along two (a
  ``[T, C]`` table, nothing quantized after it) takes ``k`` quantized to int16 per tensor instead
  (``|k - k_q| <= max|k| / 65534``) and the int32 product below. The positive-constant fold steps aside there
  for the same reason.
- ``x * y``, both quantized (``x * sigmoid(x)``, products of activations): the zero points removed into int32,
  an int32 ``Mul``, exact because ``|product| <= bound_x bound_y < 2**31`` (checked, else it declines), at
  scale ``s_x s_y``; then the Requantize into the target, or int32 left with that scale (made per tensor
  where it varies along two axes).

Each Requantize rounds the exact real product once: within one output step of the fake-quant model (which
rounds ``float32(x * y)`` half to even; the Requantize rounds half up with a dyadic multiplier of relative
error below ``2**-(bits-1)``), equal to it except at ties and where the two roundings straddle a half.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine
from ivit_onnx.dyadic import multiplier_bits

from ..pattern import Op, Rule
from .elementwise import ScaleByConst, _scaling
from .linear import _fit_int32
from .lowerer import Lowerer, Outcome

_I32 = np.dtype(np.int32)


def _one_axis(scale: np.ndarray) -> bool:
    """``scale`` varies along at most one axis (per tensor or per channel)."""
    return sum(d != 1 for d in np.shape(scale)) <= 1


def _folds(lw: Lowerer, node: gs.Node) -> bool:
    """The positive-constant fold applies and its type is one every consumer reads."""
    s = _scaling(lw, node)
    return s is not None and (lw.target(node.outputs[0]) is not None or _one_axis(s[1].scale * s[2]))


def _constant(lw: Lowerer, node: gs.Node):
    """``(data, k)`` when ``node`` is a lowered non-constant tensor times (or over) a float constant: ``k``
    the float64 factor (``1 / divisor`` for Div), else None."""
    pairs = (node.inputs, node.inputs[::-1]) if node.op == "Mul" else (node.inputs,)
    for data, k in pairs:
        got, kv = lw.get(data), lw.const_float(k)
        if (
            got is not None
            and not isinstance(got[0], gs.Constant)
            and kv is not None
            and kv.dtype.kind == "f"
        ):
            kv = kv.astype(np.float64)
            if node.op == "Div":
                if np.any(kv == 0):
                    return data, None
                kv = 1.0 / kv
            return data, kv
    return None


def _tensors(lw: Lowerer, node: gs.Node):
    """The two lowered (non-constant) inputs of a Mul, else None."""
    got = [lw.get(t) for t in node.inputs]
    if node.op != "Mul" or any(g is None or isinstance(g[0], gs.Constant) for g in got):
        return None
    return got


def _expand(lw: Lowerer, it: gs.Tensor, x: gs.Tensor, k: np.ndarray, out: gs.Tensor) -> gs.Tensor:
    """``it`` broadcast to ``k``'s shape where ``k`` is larger along some axis (a ``[T, C]`` table times an
    ``[N, 1, C]`` tensor): the Requantize that follows writes its input's shape."""
    shape = list(x.shape) if x.shape is not None else None
    if k.size == 1 or (shape is not None and len(shape) >= k.ndim and all(
        d == 1 or shape[len(shape) - k.ndim + i] == d for i, d in enumerate(k.shape)
    )):  # fmt: skip
        return it
    dims = lw.const(np.asarray(k.shape, np.int64), "shape")
    return lw.node("Expand", [it, dims], it.dtype, "broadcast", shape=out.shape)


def _int32(lw: Lowerer, it: gs.Tensor, a: Affine) -> tuple[gs.Tensor, Affine]:
    """``q - zx`` as int32 (a Cast where the zero point is 0, else a Requantize by 1)."""
    t = Affine(a.scale, 0, np.int32, bound=a.bound)
    if a.dtype == _I32 and a.zero_point == 0:
        return it, a
    if a.zero_point == 0:
        return lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape), t
    return lw.rescale(it, a, np.int64(1), np.int64(0), t, "center"), t


class Product(Rule):
    """``x * k`` / ``x / k`` (constant ``k`` of any sign and shape) and ``x * y`` (both quantized) → an exact
    integer product and a Requantize; a positive constant folds into the scale."""

    pattern = Op(("Mul", "Div"))
    label = "product"

    def check(self, lw: Lowerer, m) -> str | None:
        node = m.root
        if _folds(lw, node):
            return None
        const = _constant(lw, node)
        if const is not None:
            if const[1] is None:
                return f"divisor '{node.inputs[1].name}' has zero entries"
            return None  # a product too wide for int32 (the int16-constant path) narrows its operands
        if _tensors(lw, node) is not None:  # operands too wide for an int32 product are narrowed first
            return None
        if node.op == "Div" and lw.get(node.inputs[1]) is not None:
            return f"divisor '{node.inputs[1].name}' is not a constant: no integer division"
        return lw.missing(*node.inputs, const_ok=True) or "no input is quantized"

    def rewrite(self, lw: Lowerer, m) -> Outcome:
        node = m.root
        if _folds(lw, node):
            return ScaleByConst().rewrite(lw, m)
        const = _constant(lw, node)
        if const is not None:
            self._by_constant(lw, node, *const)
        else:
            self._of_tensors(lw, node, *_tensors(lw, node))
        lw.ctx.count("lower_integer", f"{node.op} → {self.label}")
        return Outcome.HANDLED

    @staticmethod
    def _quantized_k(lw: Lowerer, node: gs.Node, a: Affine, k: np.ndarray) -> bool:
        """No QuantizeLinear after it and ``s_x |k|`` varies along two axes: ``k`` is quantized to int16."""
        return lw.target(node.outputs[0]) is None and not _one_axis(a.scale * k)

    def _by_constant(self, lw: Lowerer, node: gs.Node, data: gs.Tensor, k: np.ndarray) -> None:
        it, a = lw.get(data)
        out = node.outputs[0]
        if self._quantized_k(lw, node, a, k):  # the int32 product with k in int16 per tensor
            kq, tk = lw.quantize_const(k, np.int16, data.name + "_factor")
            k32 = (lw.const(kq.values.astype(np.int32), "factor"), Affine(tk.scale, 0, np.int32, tk.bound))
            self._of_tensors(lw, node, (it, a), k32)
            return
        it = _expand(lw, it, data, k, out)
        t = lw.target(out)
        if t is not None:  # one Requantize by s_x k / s_t, signed, 0 where k = 0
            shape = np.broadcast_shapes(a.scale.shape, k.shape, t.scale.shape)
            r = np.broadcast_to(a.scale * k / t.scale, shape)
            b, c = lw.dyadic(np.where(r == 0, 1.0, r), multiplier_bits(a.bound), "product multiplier", True)
            b, c = np.where(r == 0, 0, b), np.where(r == 0, 0, c)
            lw.set(out, lw.rescale(it, a, b, c, t, "product"), t)
            return
        sign = np.sign(k).astype(np.int64)
        scale = a.scale * np.where(k == 0, 1.0, np.abs(k))
        t = Affine(scale, 0, np.int16 if a.dtype.itemsize == 1 else np.int32, bound=a.bound)
        lw.set(out, lw.rescale(it, a, sign, np.zeros(sign.shape, np.int64), t, "sign"), t)

    def _of_tensors(self, lw: Lowerer, node: gs.Node, x, y) -> None:
        # an int32 accumulator left unquantized (NNCF's rotary q/k projections) times a table could wrap:
        # the operands are requantized to the widths whose product fits int32 (the same real range, at most
        # 2**-(bits-1) of it lost), as a GEMM's operands are
        x, y = _fit_int32(lw, x, y, 1)
        (ia, a), (ib, b) = _int32(lw, *x), _int32(lw, *y)
        out = node.outputs[0]
        p = lw.node("Mul", [ia, ib], np.int32, "product", shape=out.shape)
        pt = Affine(a.scale * b.scale, 0, np.int32, bound=a.bound * b.bound)
        t = lw.target(out)
        if t is not None:
            lw.set(out, lw.requantize(p, pt, t), t)
        else:  # int32 left; a scale varying along two axes (per-channel times per-row) made per tensor
            lw.set(out, *((p, pt) if _one_axis(pt.scale) else lw.per_tensor(p, pt)))
