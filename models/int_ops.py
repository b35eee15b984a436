"""The private opset's integer kernels in torch (int64), bit-exact twins of the numpy references in opset/.

Each kernel takes and returns torch tensors with the reference's signature (``y_zero_point``'s dtype is
the output dtype) and the same arithmetic: int64 throughout, floor semantics, one rounding rule
(``round_shift``). ``ste(exact, approx)`` is the straight-through estimator the QAT modules use: the value
of the exact integer result with the gradient of the float function it approximates (I-ViT Sec. 3).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ivit_onnx.opset import log_int_softmax as lis
from ivit_onnx.opset._int import RECIP_M
from ivit_onnx.opset.ilayernorm import SQRT_STEPS
from ivit_onnx.opset.poly_exp import norm_shift

I64 = torch.int64
_POW2 = torch.tensor([1 << k for k in range(63)], dtype=I64)


def i64(x) -> Tensor:
    return torch.as_tensor(x).to(I64)


def pow2(c) -> Tensor:
    """``2**c`` as int64 (``0 <= c <= 62``)."""
    return torch.bitwise_left_shift(torch.ones((), dtype=I64), i64(c))


def floor_div(a, d) -> Tensor:
    """``floor(a / d)`` for positive ``d``."""
    return torch.div(i64(a), i64(d), rounding_mode="floor")


def round_shift(t, c) -> Tensor:
    """``floor((t + floor(2**c / 2)) / 2**c)``: round half up (int64 ``>>`` is floor division by ``2**c``)."""
    c = i64(c)
    return (i64(t) + (pow2(c) >> 1)) >> c


def saturate(y: Tensor, qmin: int, qmax: int, like: Tensor) -> Tensor:
    return y.clamp(qmin, qmax).to(like.dtype)


def _row_sum(x: Tensor) -> Tensor:
    return x.sum(dim=-1, keepdim=True, dtype=I64)


def requantize(x, x_zero_point, multiplier, shift, y_zero_point, *, qmin: int, qmax: int) -> Tensor:
    """``clip(round_shift((x - zx) * b, c) + zy, qmin, qmax)`` (opset ``Requantize``)."""
    t = (i64(x) - i64(x_zero_point)) * i64(multiplier)
    return saturate(round_shift(t, shift) + i64(y_zero_point), qmin, qmax, y_zero_point)


def iadd(
    a, b, a_zero_point, b_zero_point, a_multiplier, b_multiplier, shift, y_zero_point, *, qmin: int, qmax: int
) -> Tensor:
    """``clip(round_shift((a-za)*ma + (b-zb)*mb, c) + zy, qmin, qmax)`` (opset ``IAdd``)."""
    t = (i64(a) - i64(a_zero_point)) * i64(a_multiplier) + (i64(b) - i64(b_zero_point)) * i64(b_multiplier)
    return saturate(round_shift(t, shift) + i64(y_zero_point), qmin, qmax, y_zero_point)


def shift_exp(d: Tensor, x0: int, n: int) -> Tensor:
    """ShiftExp of int64 ``d <= 0``: ``~ 2**n * x0 * e**(d/x0)`` (opset ``shift_exp``)."""
    p = d + (d >> 1) - (d >> 4)
    p = torch.clamp(p, min=-n * x0)
    q = floor_div(-p, x0)
    r = -p - q * x0
    return (x0 + ((-r) >> 1)) << (n - q)


def int_div(e: Tensor, s: Tensor, bits: int) -> Tensor:
    """``e / s`` with ``bits`` fraction bits, for ``0 <= e <= s`` (opset ``int_div``)."""
    return (e * floor_div(torch.full_like(s, RECIP_M), s)) >> (62 - bits)


def shiftmax(x, y_zero_point, *, x0: int, n: int, bits: int) -> Tensor:
    """Integer softmax over the last axis (opset ``Shiftmax``)."""
    x = i64(x)
    e = shift_exp(x - x.amax(dim=-1, keepdim=True), x0, n)
    return (int_div(e, _row_sum(e), bits) + i64(y_zero_point)).to(y_zero_point.dtype)


def poly_exp(d: Tensor, x0: int, qb: int, qc: int, n: int) -> Tensor:
    """I-BERT's polynomial exp of ``d <= 0``: ``((qb - r)**2 + qc) << (n - q)`` (opset ``PolyExp``)."""
    a = torch.clamp(-d, max=n * x0)
    q = floor_div(a, x0)
    t = qb - (a - q * x0)
    return (t * t + qc) << (n - q)


def _row_exps(x, x0: int, qb: int, qc: int, n: int, k: int = 0) -> tuple[Tensor, Tensor]:
    x = i64(x)
    e = poly_exp(x - x.amax(dim=-1, keepdim=True), x0, qb, qc, n) >> k
    return e, _row_sum(e)


def ibert_softmax(x, y_zero_point, *, x0: int, qb: int, qc: int, n: int, bits: int) -> Tensor:
    """Integer softmax with I-BERT's polynomial exp (opset ``IBertSoftmax``)."""
    e, total = _row_exps(x, x0, qb, qc, n, norm_shift(qb, qc, n))
    return (int_div(e, total, bits) + i64(y_zero_point)).to(y_zero_point.dtype)


def log_int_softmax(
    x, y_zero_point, *, x0: int, qb: int, qc: int, n: int, bits: int, log_bits: int
) -> Tensor:
    """FQ-ViT's Log-Int-Softmax on the ``2**-bits`` grid (opset ``LogIntSoftmax``)."""
    e, total = _row_exps(x, x0, qb, qc, n)
    k = lis.levels(bits, log_bits)
    q = sum((e <= floor_div(2 * total, d)).to(I64) for d in lis.divisors(k))
    values = torch.from_numpy(lis.level_values(bits, k))
    return (values[q] + i64(y_zero_point)).to(y_zero_point.dtype)


def shiftgelu(
    x, multiplier, shift, y_zero_point, *, x0: int, n: int, bits: int, qmin: int, qmax: int
) -> Tensor:
    """``x * sigmoid(1.702 x)`` with shift-exps, requantized by ``b / 2**c`` (opset ``ShiftGELU``)."""
    x = i64(x)
    m = torch.clamp(x, min=0)
    e1, e2 = shift_exp(x - m, x0, n), shift_exp(-m, x0, n)
    sg = int_div(e1, e1 + e2, bits)
    y = round_shift(x * sg * i64(multiplier), shift) + i64(y_zero_point)
    return saturate(y, qmin, qmax, y_zero_point)


def isqrt(v: Tensor) -> Tensor:
    """Exact ``floor(sqrt(v))`` for ``1 <= v < 2**62`` by the opset's fixed-step Newton iteration."""
    nbits = (v.unsqueeze(-1) >= _POW2).sum(dim=-1, dtype=I64)
    r = pow2(floor_div(nbits + 1, 2))
    for _ in range(SQRT_STEPS):
        r = torch.minimum(r, floor_div(r + floor_div(v, r), 2))
    return r


def _centred(x, shift_in: int) -> Tensor:
    """``x * 2**shift_in - floor(sum(x) * 2**shift_in / C)`` of both LayerNorms (``ilayernorm.centred``)."""
    x = i64(x)
    return x * (1 << shift_in) - floor_div(_row_sum(x) * (1 << shift_in), x.shape[-1])


def _normalized_out(d, norm, multiplier, shift, bias, y_zero_point, p: int, qmin: int, qmax: int) -> Tensor:
    """``u = floor(d * floor(2**61 / norm) / 2**(61 - p))``, then the per-channel rescale with bias."""
    u = (d * floor_div(torch.full_like(norm, 1 << 61), norm)) >> (61 - p)
    y = round_shift(u * i64(multiplier) + i64(bias), shift) + i64(y_zero_point)
    return saturate(y, qmin, qmax, y_zero_point)


def ilayernorm(
    x, multiplier, shift, bias, y_zero_point, *, shift_in: int, p: int, qmin: int, qmax: int
) -> Tensor:
    """Integer LayerNorm over the last axis, gamma/beta folded (opset ``ILayerNorm``)."""
    d = _centred(x, shift_in)
    r = isqrt(torch.clamp(_row_sum(d * d), min=1))
    return _normalized_out(d, r, multiplier, shift, bias, y_zero_point, p, qmin, qmax)


def l1layernorm(
    x, multiplier, shift, bias, y_zero_point, *, shift_in: int, p: int, qmin: int, qmax: int
) -> Tensor:
    """LayerNorm by the L1 norm of the centred row, gamma/beta folded (opset ``L1LayerNorm``)."""
    d = _centred(x, shift_in)
    l1 = torch.clamp(_row_sum(d.abs()), min=1)
    return _normalized_out(d, l1, multiplier, shift, bias, y_zero_point, p, qmin, qmax)


def il2norm(
    x, x_zero_point, multiplier, shift, y_zero_point, *, shift_in: int, eps: int, p: int, qmin: int, qmax: int
) -> Tensor:
    """``x / max(||x||, eps)`` over the last axis, the zero point removed (opset ``IL2Norm``)."""
    d = (i64(x) - i64(x_zero_point)) * (1 << shift_in)
    r = torch.clamp(isqrt(torch.clamp(_row_sum(d * d), min=1)), min=eps)
    return _normalized_out(d, r, multiplier, shift, 0, y_zero_point, p, qmin, qmax)


def ibertgelu(
    x, multiplier, shift, y_zero_point, *, clip: int, coeff: int, k: int, qmin: int, qmax: int
) -> Tensor:
    """I-BERT's i-GELU, its erf a clipped 2nd-order polynomial, requantized (opset ``IBertGELU``)."""
    x = i64(x)
    t = torch.clamp(clip - x.abs(), min=0)
    e = round_shift(coeff - t * t, k)
    d = round_shift(torch.tensor(coeff, dtype=I64), k)
    g = torch.where(x < 0, d - e, d + e)
    y = round_shift(x * g * i64(multiplier), shift) + i64(y_zero_point)
    return saturate(y, qmin, qmax, y_zero_point)


#: op_type -> torch kernel, keyed like ``ivit_onnx.opset.OPS``
KERNELS = {
    "Requantize": requantize,
    "IAdd": iadd,
    "Shiftmax": shiftmax,
    "ShiftGELU": shiftgelu,
    "ILayerNorm": ilayernorm,
    "IBertGELU": ibertgelu,
    "L1LayerNorm": l1layernorm,
    "IBertSoftmax": ibert_softmax,
    "LogIntSoftmax": log_int_softmax,
    "IL2Norm": il2norm,
}


class _STE(torch.autograd.Function):
    """Forward: the exact value; backward: the gradient of the float approximation, unchanged."""

    @staticmethod
    def forward(ctx, approx: Tensor, exact: Tensor) -> Tensor:
        return exact.detach().to(approx.dtype).clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def ste(exact: Tensor, approx: Tensor) -> Tensor:
    """``exact``'s value, ``approx``'s gradient (straight-through through the float function)."""
    return _STE.apply(approx, exact)
