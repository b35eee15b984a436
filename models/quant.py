"""I-ViT-style fake quantization of a float model, exportable to standard QDQ ONNX.

Weights of Linear/Conv2d: symmetric int8, per output channel (bias stays float; the converter makes it
int32 with scale s_x*s_w). Activations: per tensor, min/max-calibrated, symmetric int8 (zero point 0) or
asymmetric uint8; the residual stream optionally int16; softmax output uint8 with a fixed scale.

The fake-quant ops are torch custom ops whose ONNX meaning is QuantizeLinear → DequantizeLinear; their
translations for both torch exporters live here, next to the torch definition (see `export.py`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import QuantPoint

ACT_DTYPES = {"int8": torch.int8, "uint8": torch.uint8}
RESIDUAL_DTYPES = {8: None, 16: torch.int16}  # None: same as the other activations
MIN_SCALE = 1e-8  # floor for scales of all-zero tensors/channels (ONNX forbids a zero scale)


def _fake_quant(x: Tensor, scale: Tensor, zero_point: Tensor) -> Tensor:
    """(clamp(round(x / s) + z) - z) * s, rounding half to even like ONNX QuantizeLinear."""
    info = torch.iinfo(zero_point.dtype)
    z = zero_point.to(x.dtype)
    return ((torch.round(x / scale) + z).clamp(info.min, info.max) - z) * scale


@torch.library.custom_op("ivit_onnx::fake_quant_per_tensor", mutates_args=())
def fake_quant_per_tensor(x: Tensor, scale: Tensor, zero_point: Tensor) -> Tensor:
    """Per-tensor fake quantization; the integer range is that of zero_point's dtype."""
    return _fake_quant(x, scale, zero_point)


@torch.library.custom_op("ivit_onnx::fake_quant_per_channel", mutates_args=())
def fake_quant_per_channel(x: Tensor, scale: Tensor, zero_point: Tensor, axis: int) -> Tensor:
    """Per-channel fake quantization along `axis` (scale and zero_point are 1-D)."""
    shape = [1] * x.dim()
    shape[axis] = -1
    return _fake_quant(x, scale.reshape(shape), zero_point.reshape(shape))


@fake_quant_per_tensor.register_fake
def _fake_quant_per_tensor_meta(x, scale, zero_point):
    return torch.empty_like(x)


@fake_quant_per_channel.register_fake
def _fake_quant_per_channel_meta(x, scale, zero_point, axis):
    return torch.empty_like(x)


def _ste_per_tensor(ctx, grad):
    """Straight-through estimator (the paper's naive STE): the gradient passes unchanged."""
    return grad, None, None


def _ste_per_channel(ctx, grad):
    """Straight-through estimator for the per-channel op."""
    return grad, None, None, None


fake_quant_per_tensor.register_autograd(_ste_per_tensor)
fake_quant_per_channel.register_autograd(_ste_per_channel)


def onnx_translation_table() -> dict:
    """ONNX (onnxscript) forms of the fake-quant ops, for `torch.onnx.export(dynamo=True)`."""
    from onnxscript import opset18 as op

    def per_tensor(x, scale, zero_point):
        return op.DequantizeLinear(op.QuantizeLinear(x, scale, zero_point), scale, zero_point)

    def per_channel(x, scale, zero_point, axis: int):
        q = op.QuantizeLinear(x, scale, zero_point, axis=axis)
        return op.DequantizeLinear(q, scale, zero_point, axis=axis)

    return {
        torch.ops.ivit_onnx.fake_quant_per_tensor.default: per_tensor,
        torch.ops.ivit_onnx.fake_quant_per_channel.default: per_channel,
    }


def register_torchscript_symbolics() -> None:
    """ONNX forms of the fake-quant ops for the TorchScript exporter (`torch.onnx.export(dynamo=False)`)."""
    from torch.onnx import symbolic_helper

    def per_tensor(g, x, scale, zero_point):
        return g.op("DequantizeLinear", g.op("QuantizeLinear", x, scale, zero_point), scale, zero_point)

    def per_channel(g, x, scale, zero_point, axis):
        axis = symbolic_helper._get_const(axis, "i", "axis")
        q = g.op("QuantizeLinear", x, scale, zero_point, axis_i=axis)
        return g.op("DequantizeLinear", q, scale, zero_point, axis_i=axis)

    torch.onnx.register_custom_op_symbolic("ivit_onnx::fake_quant_per_tensor", per_tensor, 13)
    torch.onnx.register_custom_op_symbolic("ivit_onnx::fake_quant_per_channel", per_channel, 13)


class ActFakeQuant(nn.Module):
    """Per-tensor activation fake-quant: records min/max while calibrating, then quantizes."""

    def __init__(self, dtype: torch.dtype, fixed_scale: float | None = None):
        super().__init__()
        self.register_buffer("scale", torch.tensor(1.0 if fixed_scale is None else fixed_scale))
        self.register_buffer("zero_point", torch.tensor(0, dtype=dtype))
        self.calibrating = fixed_scale is None
        self.lo, self.hi = float("inf"), float("-inf")

    def forward(self, x: Tensor) -> Tensor:
        if self.calibrating:
            self.lo = min(self.lo, x.detach().min().item())
            self.hi = max(self.hi, x.detach().max().item())
            return x
        return fake_quant_per_tensor(x, self.scale, self.zero_point)

    def freeze(self) -> None:
        """Turn the observed range into a scale (symmetric for signed dtypes) and start quantizing."""
        if not self.calibrating:
            return
        if self.lo > self.hi:
            raise RuntimeError("quantizer saw no data during calibration")
        info = torch.iinfo(self.zero_point.dtype)
        lo, hi = min(self.lo, 0.0), max(self.hi, 0.0)
        if info.min < 0:
            scale, zero_point = max(-lo, hi, MIN_SCALE) / info.max, 0
        else:
            scale = max(hi - lo, MIN_SCALE) / (info.max - info.min)
            zero_point = min(max(round(-lo / scale), info.min), info.max)
        self.scale.fill_(scale)
        self.zero_point.fill_(zero_point)
        self.calibrating = False

    def extra_repr(self) -> str:
        state = "calibrating" if self.calibrating else f"scale={self.scale.item():.6g}"
        return f"dtype={self.zero_point.dtype}, zero_point={self.zero_point.item()}, {state}"


def _weight_scale(weight: Tensor) -> Tensor:
    """Symmetric int8 scale per output channel (axis 0): max|w| / 127."""
    amax = weight.detach().abs().flatten(1).amax(dim=1)
    return amax.clamp(min=MIN_SCALE) / 127


class QLinear(nn.Linear):
    """nn.Linear with per-output-channel int8 fake-quant weights (same parameter names)."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.in_features, linear.out_features, linear.bias is not None)
        self.load_state_dict(linear.state_dict())
        self.register_buffer("w_scale", _weight_scale(self.weight))
        self.register_buffer("w_zero_point", torch.zeros(self.out_features, dtype=torch.int8))

    def forward(self, x: Tensor) -> Tensor:
        w = fake_quant_per_channel(self.weight, self.w_scale, self.w_zero_point, 0)
        return F.linear(x, w, self.bias)


class QConv2d(nn.Conv2d):
    """nn.Conv2d with per-output-channel int8 fake-quant weights (same parameter names)."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            conv.padding,
            conv.dilation,
            conv.groups,
            conv.bias is not None,
            conv.padding_mode,
        )
        self.load_state_dict(conv.state_dict())
        self.register_buffer("w_scale", _weight_scale(self.weight))
        self.register_buffer("w_zero_point", torch.zeros(self.out_channels, dtype=torch.int8))

    def forward(self, x: Tensor) -> Tensor:
        w = fake_quant_per_channel(self.weight, self.w_scale, self.w_zero_point, 0)
        return self._conv_forward(x, w, self.bias)


def refresh_weight_scales(model: nn.Module, qmax: int = 127) -> None:
    """``w_scale = max|w| / qmax`` per output channel of every fake-quant Linear/Conv2d of ``model`` (QAT: the
    weights moved; the export carries the new scales)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, QLinear | QConv2d):
                amax = m.weight.abs().flatten(1).amax(dim=1)
                m.w_scale.copy_(amax.clamp(min=MIN_SCALE) / qmax)


def _act_quantizer(
    role: str,
    act_dtype: torch.dtype,
    residual_bits: int,
    softmax_scale: float,
    quantize_scores: bool,
    qkv: str,
) -> nn.Module | None:
    """The quantizer a QuantPoint of `role` becomes, or None to leave it an identity."""
    if role == "prob":
        return ActFakeQuant(torch.uint8, fixed_scale=softmax_scale)
    if role == "residual":
        return ActFakeQuant(RESIDUAL_DTYPES[residual_bits] or act_dtype)
    enabled = {
        "act": True,
        "scores": quantize_scores,
        "qkv": qkv == "joint",
        "qkv_split": qkv == "split",
    }[role]
    return ActFakeQuant(act_dtype) if enabled else None


def _swap_modules(model: nn.Module, **options) -> None:
    """Replace QuantPoints by activation quantizers and Linear/Conv2d by their fake-quant versions."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, QuantPoint):
                new = _act_quantizer(child.role, **options)
            elif type(child) is nn.Linear:
                new = QLinear(child)
            elif type(child) is nn.Conv2d:
                new = QConv2d(child)
            else:
                continue
            if new is not None:
                setattr(parent, name, new)


def quantize(
    model: nn.Module,
    calib_batches: Iterable[Tensor],
    act_dtype: str = "int8",
    residual_bits: int = 8,
    softmax_scale: float = 1 / 256,
    quantize_scores: bool = True,
    qkv: str = "joint",
) -> nn.Module:
    """Fake-quantized copy of `model` (in eval mode), activation ranges calibrated on `calib_batches`.

    act_dtype: "int8" (symmetric, zero point 0) or "uint8" (asymmetric). residual_bits: 8 or 16 for the
    residual stream (and the position-embedding add). softmax_scale: the fixed uint8 scale of softmax
    outputs (1/256 or 1/128). quantize_scores: also quantize attention scores before softmax.
    qkv: "joint" (one scale after the qkv Linear, as I-ViT) or "split" (q, k, v each after the split).
    Weight scales (max|w| per output channel) are fixed here; the ops pass gradients straight through,
    but after changing the weights (QAT) call `quantize` again to refresh the weight scales.
    """
    if act_dtype not in ACT_DTYPES:
        raise ValueError(f"act_dtype must be one of {sorted(ACT_DTYPES)}, got {act_dtype!r}")
    if residual_bits not in RESIDUAL_DTYPES:
        raise ValueError(f"residual_bits must be one of {sorted(RESIDUAL_DTYPES)}, got {residual_bits}")
    if qkv not in ("joint", "split"):
        raise ValueError(f"qkv must be 'joint' or 'split', got {qkv!r}")
    fq = copy.deepcopy(model).eval()
    _swap_modules(
        fq,
        act_dtype=ACT_DTYPES[act_dtype],
        residual_bits=residual_bits,
        softmax_scale=softmax_scale,
        quantize_scores=quantize_scores,
        qkv=qkv,
    )
    seen = False
    with torch.no_grad():
        for batch in calib_batches:
            fq(batch)
            seen = True
    if not seen:
        raise ValueError("calib_batches is empty")
    for m in fq.modules():
        if isinstance(m, ActFakeQuant):
            m.freeze()
    return fq


def act_quantizers(model: nn.Module) -> dict[str, ActFakeQuant]:
    """The activation quantizers of a fake-quant model, by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, ActFakeQuant)}
