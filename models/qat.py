"""QAT that trains what is deployed: a fake-quant ViT whose forward is its integer graph, tensor for tensor.

``qat(model, calib)`` quantizes ``model`` like :func:`.quant.quantize` (min/max calibration) and wraps the
result in :class:`IntegerViT`. Its forward runs, in torch int64, every op ``ivit-onnx rewrite`` emits for
the fake-quant model's export -- integer MatMul/Conv with int32 bias, dyadic Requantize, IAdd, Shiftmax,
ShiftGELU, ILayerNorm (``int_ops`` kernels, bit-exact with the opset's numpy references) -- with every
parameter derived by :mod:`ivit_onnx.qparams`, the converter's own derivation. So the export of
``IntegerViT.fq`` converts into an integer graph whose logits equal ``IntegerViT``'s, bit for bit.

Each op's backward is a straight-through estimate through the float function it replaces (I-ViT Sec. 3):
the value is the integer result, the gradient that of Linear/softmax/GELU/LayerNorm/add at that value.
Activation scales are EMA-calibrated while training (symmetric ``absmax`` EMA, ``ema`` momentum, starting
from the min/max calibration; softmax's fixed ``2**-8`` excepted); weight scales are ``max|w| / qmax`` per
output channel, recomputed every forward, with ``qmax = 2**(weight_bits-1) - 1``.
Supported: :class:`.vit.VisionTransformer` without distillation token, int8 symmetric activations.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ivit_onnx import qparams
from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.io import quantize as quantize_linear
from ivit_onnx.pipeline import Options

from . import int_ops
from .quant import (
    MIN_SCALE,
    ActFakeQuant,
    QConv2d,
    QLinear,
    fake_quant_per_channel,
    quantize,
    refresh_weight_scales,
)
from .vit import VisionTransformer

_NP_DTYPES = {torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16, torch.int32: np.int32}
_INT32 = Affine(np.float64(1.0), 0, np.int32)
@dataclass
class QT:
    """An integer tensor on its way through the model: integers, their affine type, and the float value
    (``deq(q)``) that carries the straight-through gradient."""

    q: Tensor
    a: Affine
    v: Tensor


_recorded: list[Tensor] | None = None


@contextmanager
def record_integers() -> Iterator[list[Tensor]]:
    """Collect every integer tensor the forwards inside compute (each op's output, in order), for
    tensor-for-tensor comparisons with the integer graph."""
    global _recorded
    _recorded, saved = [], _recorded
    try:
        yield _recorded
    finally:
        _recorded = saved


def _kept(q: Tensor) -> Tensor:
    if _recorded is not None:
        _recorded.append(q.detach().clone())
    return q


def _zp(value: int) -> Tensor:
    return torch.tensor(value, dtype=torch.int64)


def _i64(a) -> Tensor:
    """An int64 torch tensor of numpy integer parameters (multipliers, shifts, biases)."""
    return torch.from_numpy(np.array(a, dtype=np.int64))


def dequantize(q: Tensor, a: Affine) -> Tensor:
    """``(q - zero_point) * scale`` in float32, as the DequantizeLinear of ``a``."""
    return ((q - a.zero_point).to(torch.float64) * torch.from_numpy(np.asarray(a.scale))).float()


def _lift(q: Tensor, a: Affine, approx: Tensor) -> QT:
    return QT(_kept(q), a, int_ops.ste(dequantize(q, a), approx))


def _int_matmul(a: Tensor, b: Tensor) -> Tensor:
    """Exact integer matmul (int8/uint8 operands, sums far below 2**53: float64 is exact)."""
    return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.int64)


def _rescale(q: Tensor, a: Affine, t: Affine) -> Tensor:
    """The converter's Requantize from ``a`` to ``t`` (nothing when the types agree)."""
    if a.same_as(t):
        return q
    b, c = qparams.requantize(a, t)
    lo, hi = t.qrange
    return _kept(
        int_ops.requantize(q, _zp(a.zero_point), _i64(b), _i64(c), _zp(t.zero_point), qmin=lo, qmax=hi)
    )


def _upscale(q: Tensor, a: Affine, up: qparams.Upscale) -> Tensor:
    return _rescale_by(q, a, up.m, 0, up.a)


def _rescale_by(q: Tensor, a: Affine, m: int, c: int, t: Affine) -> Tensor:
    """The Requantize ``round_shift((q - zp) * m, c)`` into int32 ``t`` (none when ``(m, c) == (1, 0)``)."""
    if (m, c) == (1, 0):
        return q
    lo, hi = t.qrange
    return _kept(int_ops.requantize(q, _zp(a.zero_point), _zp(m), _zp(c), _zp(0), qmin=lo, qmax=hi))


def act_type(qz: ActFakeQuant) -> Affine:
    """The type a QuantizeLinear → DequantizeLinear pair gives its output (float32 scale, as exported)."""
    return Affine(np.float64(float(qz.scale)), int(qz.zero_point), _NP_DTYPES[qz.zero_point.dtype])


def _const_type(q: np.ndarray, scale: np.ndarray) -> Affine:
    """A DequantizeLinear of an integer constant: its bound is the constant's largest magnitude."""
    return Affine(np.asarray(scale, np.float64), 0, q.dtype, bound=int(np.max(np.abs(q.astype(np.int64)))))


# ---- the nonlinear ops' integer kernels, as ``passes/rules/nonlinear.py`` emits them ----------------------


def softmax_kernel(q: Tensor, a: Affine, target: Affine | None, opt: Options) -> tuple[Tensor, Affine]:
    """The integer softmax ``opt.softmax`` picks over the last axis of ``q`` (per-tensor type ``a``), written
    in ``target`` where its scale allows: the input's rescale onto the exp grid, then the op. Returns the
    output integers and their type."""
    if opt.softmax == "shiftmax":
        sp = qparams.shiftmax(a, q.shape[-1], target, opt.min_x0)
        y = int_ops.shiftmax(_upscale(q, a, sp.up), _zp(sp.t.zero_point), x0=sp.x0, n=sp.n, bits=sp.bits)
        return y, sp.t
    op = qparams.KERNELS["softmax"][opt.softmax].op
    pp = qparams.poly_softmax(a, q.shape[-1], target, opt.min_x0)
    q = _rescale_by(q, a, pp.grid.m, pp.grid.c, pp.grid.a)
    return int_ops.KERNELS[op](q, _zp(pp.t.zero_point), **pp.attrs(op)), pp.t


def gelu_kernel(q: Tensor, a: Affine, target: Affine | None, opt: Options) -> tuple[Tensor, Affine]:
    """ShiftGELU or IBertGELU (``opt.gelu``) of ``q`` (symmetric per-tensor type ``a``), requantized into
    ``target``: the exact upscale, then the op. Returns the output integers and their type."""
    spec = qparams.KERNELS["gelu"][opt.gelu]
    kernel, attrs = int_ops.KERNELS[spec.op], spec.attrs
    gp = spec.params(a, target, opt.min_x0, opt.gelu_bits)
    lo, hi = gp.t.qrange
    y = kernel(
        _upscale(q, a, gp.up),
        _i64(gp.multiplier),
        _i64(gp.shift),
        _zp(gp.t.zero_point),
        **{k: getattr(gp, k) for k in attrs},
        qmin=lo,
        qmax=hi,
    )
    return y, gp.t


def layernorm_kernel(
    q: Tensor, a: Affine, ln: nn.LayerNorm, target: Affine | None, opt: Options
) -> tuple[Tensor, Affine]:
    """ILayerNorm or L1LayerNorm (``opt.layernorm``) over the last axis of ``q`` (type ``a``) with ``ln``'s
    gamma and beta folded, into ``target``: an optional narrowing Requantize, then the op."""
    gamma = ln.weight.detach().numpy()
    beta = ln.bias.detach().numpy() if ln.bias is not None else None
    spec = qparams.KERNELS["layernorm"][opt.layernorm]
    kernel = int_ops.KERNELS[spec.op]
    lp = spec.params(a, q.shape[-1], gamma, beta, target, opt.ln_fraction_bits)
    q = q if lp.pre is None else _rescale(q, a, lp.pre)
    lo, hi = dtype_range(lp.t.dtype)
    y = kernel(
        q,
        _i64(lp.multiplier),
        _i64(lp.shift),
        _i64(lp.bias),
        _zp(lp.t.zero_point),
        shift_in=lp.shift_in,
        p=lp.p,
        qmin=lo,
        qmax=hi,
    )
    return y, lp.t


class IntegerViT(nn.Module):
    """A fake-quant ViT (``fq``, from :func:`.quant.quantize`) run as its integer graph (see the module)."""

    def __init__(
        self, fq: VisionTransformer, weight_bits: int = 8, ema: float = 0.9, options: Options | None = None
    ):
        super().__init__()
        if not isinstance(fq, VisionTransformer) or fq.dist_token is not None:
            raise ValueError("IntegerViT supports VisionTransformer without a distillation token")
        if not 2 <= weight_bits <= 8:
            raise ValueError(f"weight_bits must be 2..8, got {weight_bits}")
        for name, m in fq.named_modules():
            if isinstance(m, ActFakeQuant) and m.calibrating:
                raise ValueError(f"{name}: quantizer not calibrated")
            if isinstance(m, ActFakeQuant) and m.zero_point.item() != 0:
                raise ValueError(f"{name}: IntegerViT needs symmetric activations (zero point 0)")
        self.fq = fq
        self.w_qmax = 2 ** (weight_bits - 1) - 1
        self.ema = ema
        self.opt = options or Options()
        self._absmax: dict[int, float] = {}
        self.refresh_weight_scales()

    # ---- scales ---------------------------------------------------------------------------------------
    def refresh_weight_scales(self) -> None:
        """``w_scale = max|w| / qmax`` per output channel of every Linear/Conv2d (the export carries it)."""
        refresh_weight_scales(self.fq, self.w_qmax)

    def _target(self, qz: nn.Module, *approx: Tensor, observe: bool = True) -> Affine | None:
        """The type of the QuantizeLinear ``qz`` (None: none); EMA-updates its scale while training."""
        if not isinstance(qz, ActFakeQuant):
            return None
        if observe and self.training and self.ema < 1 and qz.zero_point.dtype == torch.int8:
            info = torch.iinfo(torch.int8)
            amax = max(float(t.detach().abs().max()) for t in approx)
            prev = self._absmax.get(id(qz), float(qz.scale) * info.max)
            new = self.ema * prev + (1 - self.ema) * amax
            self._absmax[id(qz)] = new
            qz.scale.fill_(max(new, MIN_SCALE) / info.max)
        return act_type(qz)

    # ---- ops ------------------------------------------------------------------------------------------
    def _quant(self, t: QT, qz: nn.Module, observe: bool = True) -> QT:
        """A QuantizeLinear point: Requantize into the quantizer's type (folded when the types agree)."""
        target = self._target(qz, t.v, observe=observe)
        if target is None:
            return t
        q = _rescale(t.q, t.a, target)
        return QT(q, target, int_ops.ste(dequantize(q, target), t.v))

    def _weight(self, m: QLinear | QConv2d) -> tuple[Tensor, Affine, Tensor]:
        """Integer weights (as the converter folds them), their type, and the STE fake-quant weight."""
        w = m.weight.detach().numpy()
        scale = m.w_scale.numpy()
        w_q = quantize_linear(w, scale, np.zeros(scale.shape, np.int8), axis=0)
        w_fq = fake_quant_per_channel(m.weight, m.w_scale, m.w_zero_point, 0)
        return torch.from_numpy(w_q.astype(np.int64)), _const_type(w_q, scale), w_fq

    def _add_bias(self, acc: Tensor, a: Affine, bias: Tensor | None, approx: Tensor, shape=(-1,)) -> QT:
        if bias is not None:
            bq, a = qparams.bias(a, bias.detach().numpy().reshape(shape))
            acc = acc + _i64(bq)
        return _lift(acc, a, approx)

    def _linear(self, t: QT, m: QLinear) -> QT:
        """MatMulInteger (or Gemm) with the int8 weight, then the int32 bias Add."""
        w_q, w_a, w_fq = self._weight(m)
        acc_a = qparams.accumulator(t.a, w_a, m.in_features)
        acc = _int_matmul(t.q, w_q.T)
        return self._add_bias(acc, acc_a, m.bias, F.linear(t.v, w_fq, m.bias))

    def _matmul(self, x: QT, y: QT, scale: float = 1.0) -> QT:
        """Activation × activation MatMulInteger (attention); a constant Mul folds into the scale."""
        acc_a = qparams.accumulator(x.a, y.a, y.q.shape[-2])
        if scale != 1.0:
            acc_a = acc_a.scaled(float(np.float32(scale)))
        return _lift(_int_matmul(x.q, y.q), acc_a, (x.v @ y.v) * scale)

    def _iadd(self, x: QT, y: QT, qz: nn.Module) -> QT:
        approx = x.v + y.v
        t = self._target(qz, approx) or qparams.iadd_type(x.a, y.a)
        ma, mb, c = qparams.iadd(x.a, y.a, t)
        q = int_ops.iadd(
            x.q,
            y.q,
            _zp(x.a.zero_point),
            _zp(y.a.zero_point),
            _i64(ma),
            _i64(mb),
            _zp(c),
            _zp(t.zero_point),
            qmin=t.qrange[0],
            qmax=t.qrange[1],
        )
        return _lift(q, t, approx)

    def _layernorm(self, x: QT, ln: nn.LayerNorm, qz: nn.Module) -> QT:
        approx = F.layer_norm(x.v, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
        y, t = layernorm_kernel(x.q, x.a, ln, self._target(qz, approx), self.opt)
        return _lift(y, t, approx)

    def _softmax(self, x: QT, qz: nn.Module) -> QT:
        approx = x.v.softmax(dim=-1)
        x = self._per_tensor(x)
        y, t = softmax_kernel(x.q, x.a, self._target(qz, approx), self.opt)
        return self._quant(_lift(y, t, approx), qz, observe=False)

    def _gelu(self, x: QT, act: nn.Module, qz: nn.Module) -> QT:
        approx = act(x.v)
        x = self._per_tensor(x)
        y, t = gelu_kernel(x.q, x.a, self._target(qz, approx), self.opt)
        return self._quant(_lift(y, t, approx), qz, observe=False)

    def _per_tensor(self, x: QT) -> QT:
        if x.a.per_tensor:
            return x
        t = qparams.per_tensor(x.a)
        return QT(_rescale(x.q, x.a, t), t, x.v)

    def _const(self, p: Tensor, qz: ActFakeQuant) -> QT:
        """A parameter behind a QuantizeLinear (class token, position embedding): an int8 constant."""
        scale = np.asarray(qz.scale.numpy())
        q = quantize_linear(p.detach().numpy(), scale, np.asarray(qz.zero_point.numpy()), axis=1)
        a = _const_type(q, scale)
        return _lift(torch.from_numpy(q.astype(np.int64)), a, p)

    # ---- the model ------------------------------------------------------------------------------------
    def _embed(self, x: Tensor) -> QT:
        m = self.fq
        t_in = self._target(m.q_input, x)
        xq = torch.clamp(torch.round(x / m.q_input.scale), *t_in.qrange).to(torch.int64)
        x = QT(xq, t_in, int_ops.ste(dequantize(xq, t_in), x))
        conv = m.patch_embed.proj
        w_q, w_a, w_fq = self._weight(conv)
        acc_a = qparams.conv_accumulator(x.a, w_a, int(np.prod(w_q.shape[1:])), w_q.dim() - 2)
        acc = F.conv2d(
            x.q.double(), w_q.double(), None, conv.stride, conv.padding, conv.dilation, conv.groups
        ).to(torch.int64)
        h = self._per_tensor(
            self._add_bias(acc, acc_a, conv.bias, conv._conv_forward(x.v, w_fq, conv.bias), (-1, 1, 1))
        )
        h = QT(h.q.flatten(2).transpose(1, 2), h.a, h.v.flatten(2).transpose(1, 2))
        self._target(m.q_embed, h.v, m.cls_token)  # one EMA step over everything q_embed quantizes
        h = self._quant(h, m.q_embed, observe=False)
        cls = self._const(m.cls_token, m.q_embed)
        cls = QT(cls.q.expand(h.q.shape[0], -1, -1), cls.a, cls.v.expand(h.q.shape[0], -1, -1))
        t = qparams.concat_type([cls.a, h.a])
        q = torch.cat([_rescale(cls.q, cls.a, t), _rescale(h.q, h.a, t)], dim=1)
        x = _lift(q, t, torch.cat([cls.v, h.v], dim=1))
        return self._iadd(x, self._const(m.pos_embed, m.q_pos), m.q_pos_add)

    def _attention(self, attn, x: QT) -> QT:
        B, N, C = x.q.shape
        H = attn.num_heads
        qkv = self._quant(self._linear(x, attn.qkv), attn.q_qkv)

        def split(t: Tensor) -> tuple[Tensor, ...]:
            return t.reshape(B, N, 3, H, C // H).permute(2, 0, 3, 1, 4).unbind(0)

        parts = [QT(q, qkv.a, v) for q, v in zip(split(qkv.q), split(qkv.v), strict=True)]
        q, k, v = (self._quant(p, qz) for p, qz in zip(parts, (attn.q_q, attn.q_k, attn.q_v), strict=True))
        kt = QT(k.q.transpose(-2, -1), k.a, k.v.transpose(-2, -1))
        scores = self._quant(self._matmul(q, kt, attn.scale), attn.q_scores)
        prob = self._softmax(scores, attn.q_prob)
        ctx = self._quant(self._matmul(prob, v), attn.q_ctx)
        ctx = QT(ctx.q.transpose(1, 2).reshape(B, N, C), ctx.a, ctx.v.transpose(1, 2).reshape(B, N, C))
        return self._quant(self._linear(ctx, attn.proj), attn.q_proj)

    def _block(self, blk, x: QT) -> QT:
        x = self._iadd(x, self._attention(blk.attn, self._layernorm(x, blk.norm1, blk.q_norm1)), blk.q_res1)
        mlp = blk.mlp
        h = self._quant(self._linear(self._layernorm(x, blk.norm2, blk.q_norm2), mlp.fc1), mlp.q_fc1)
        h = self._quant(self._linear(self._gelu(h, mlp.act, mlp.q_act), mlp.fc2), mlp.q_fc2)
        return self._iadd(x, h, blk.q_res2)

    def forward(self, x: Tensor) -> Tensor:
        """Logits, exactly as the integer graph's output DequantizeLinear computes them (float32)."""
        self.refresh_weight_scales()
        m = self.fq
        h = self._embed(x)
        for blk in m.blocks:
            h = self._block(blk, h)
        h = self._layernorm(h, m.norm, m.q_norm)
        h = QT(h.q[:, 0], h.a, h.v[:, 0])
        out = self._linear(h, m.head)
        if not isinstance(m.q_head, ActFakeQuant):
            return out.v
        out = self._quant(out, m.q_head)
        a = out.a
        exact = (out.q - a.zero_point).to(torch.float32) * m.q_head.scale
        return int_ops.ste(exact, out.v)


def qat(
    model: VisionTransformer,
    calib: Iterable[Tensor],
    weight_bits: int = 8,
    ema: float = 0.9,
    options: Options | None = None,
    **quant_options,
) -> IntegerViT:
    """The QAT model of ``model``: min/max-calibrated like :func:`.quant.quantize` (int8 symmetric
    activations, ``quant_options`` passed on), run as its integer graph. Export ``result.fq``."""
    if quant_options.get("act_dtype", "int8") != "int8":
        raise ValueError("qat needs act_dtype='int8' (symmetric activations)")
    return IntegerViT(quantize(model, calib, **quant_options), weight_bits, ema, options)
