"""Softmax / Gelu / LayerNormalization → Shiftmax / ShiftGELU / ILayerNorm from the input's own scale.

The kernel is ``Options.softmax`` / ``gelu`` / ``layernorm`` (:data:`ivit_onnx.qparams.KERNELS`: I-ViT's by
default, the paper's ablation alternatives on request); each rule builds its emitters from that table.
Each writes its output directly in the type of the QuantizeLinear that follows it where that is exact
(Shiftmax: a power-of-two scale; ShiftGELU/ILayerNorm requantize inside), else in a default type that
the following QuantizeLinear requantizes.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import qparams
from ivit_onnx.affine import Affine, dtype_range
from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import node_label

from ..pattern import Op, Rule, last_axis
from .lowerer import Lowerer, Outcome


def _last_dim(t: gs.Tensor) -> int | None:
    if t.shape is None or not t.shape or not isinstance(t.shape[-1], int):
        return None
    return int(t.shape[-1])


def _upscale(lw: Lowerer, it, a: Affine, up: qparams.Upscale):
    """The exact ``q * m`` Requantize of :func:`ivit_onnx.qparams.fine_grid` (nothing when ``m == 1``)."""
    return (
        it
        if up.m == 1
        else lw.rescale(it, a, np.int64(up.m), np.int64(0), Affine(1.0, 0, np.int32), "upscale")
    )


def _emit(lw: Lowerer, node: gs.Node, op: str, inputs: list, t: Affine, **attrs) -> Outcome:
    """The private op writing ``node``'s output in type ``t`` (its y_zero_point last; qmin/qmax from ``t``
    unless the op has none)."""
    if op not in SOFTMAX_OPS:
        attrs.update(zip(("qmin", "qmax"), dtype_range(t.dtype), strict=True))
    out = lw.private(
        op,
        [*inputs, lw.zp(t.zero_point, t.dtype, "y_zp")],
        t.dtype,
        op.lower(),
        shape=node.outputs[0].shape,
        **attrs,
    )
    lw.set(node.outputs[0], out, t)
    return Outcome.HANDLED


#: the private softmaxes: no clip (their outputs lie in ``[zy, zy + 2**bits - 1]``), so no qmin/qmax
SOFTMAX_OPS = ("Shiftmax", "IBertSoftmax", "LogIntSoftmax")


def _variant(lw: Lowerer, node: gs.Node, op: str, emitters: dict):
    """The emitter of the kernel the options chose for ``op`` (``softmax``, ``gelu``, ``layernorm``)."""
    choice = getattr(lw.opt, op)
    if choice not in emitters:
        raise ConversionError(f"{node_label(node)}: --{op} {choice} is not implemented")
    return emitters[choice]


def _shiftmax(lw: Lowerer, node: gs.Node, it, a: Affine, row: int) -> Outcome:
    sp = qparams.shiftmax(a, row, lw.target(node.outputs[0]), lw.opt.min_x0)
    return _emit(lw, node, "Shiftmax", [_upscale(lw, it, a, sp.up)], sp.t, x0=sp.x0, n=sp.n, bits=sp.bits)


def _poly_softmax(op: str):
    """The emitter of a polynomial-exp softmax ``op`` (IBertSoftmax, LogIntSoftmax): the input on its ``ln 2``
    grid (:func:`ivit_onnx.qparams.poly_grid`: an exact upscale or a power-of-two downscale), then the op."""

    def emit(lw: Lowerer, node: gs.Node, it, a: Affine, row: int) -> Outcome:
        pp = qparams.poly_softmax(a, row, lw.target(node.outputs[0]), lw.opt.min_x0)
        g = pp.grid
        if (g.m, g.c) != (1, 0):
            it = lw.rescale(it, a, np.int64(g.m), np.int64(g.c), g.a, "exp_grid")
        return _emit(lw, node, op, [it], pp.t, **pp.attrs(op))

    return emit


#: Softmax kernels by ``Options.softmax``: ``(lw, node, input, per-tensor type, row length)``
#: (``ibert``: I-BERT's polynomial exp, ``lis``: FQ-ViT's Log-Int-Softmax; the paper's Table 2)
SOFTMAX = {
    c: _shiftmax if k.params is qparams.shiftmax else _poly_softmax(k.op)
    for c, k in qparams.KERNELS["softmax"].items()
}


class Softmax(Rule):
    """Softmax over the last axis → Shiftmax, written in the following QuantizeLinear's type if exact."""

    pattern = Op("Softmax")

    def check(self, lw, m):
        axis = m.root.attrs.get("axis", -1 if lw.ctx.opset >= 13 else 1)
        return lw.missing(m.root.inputs[0]) or (
            None if last_axis(axis, m.root.inputs[0]) else "not over the last axis"
        )

    def rewrite(self, lw, m):
        it, a = lw.per_tensor(*lw.get(m.root.inputs[0]))
        row = _last_dim(m.root.inputs[0]) or lw.opt.max_row
        return _variant(lw, m.root, "softmax", SOFTMAX)(lw, m.root, it, a, row)


def _gelu(kernel: qparams.Kernel):
    """The emitter of a GELU kernel (ShiftGELU, IBertGELU): the exact upscale, then the op, requantized
    inside."""

    def emit(lw: Lowerer, node: gs.Node, it, a: Affine) -> Outcome:
        target = lw.target(node.outputs[0])
        gp = kernel.params(a, target, lw.opt.min_x0, lw.opt.gelu_bits, lw.dyadic)
        inputs = [_upscale(lw, it, a, gp.up), lw.const(gp.multiplier, "mult"), lw.const(gp.shift, "shift")]
        return _emit(lw, node, kernel.op, inputs, gp.t, **{k: getattr(gp, k) for k in kernel.attrs})

    return emit


#: GELU kernels by ``Options.gelu``: ``(lw, node, input, symmetric per-tensor type)``
GELU = {c: _gelu(k) for c, k in qparams.KERNELS["gelu"].items()}


class Gelu(Rule):
    """Gelu (the fusion's marker, or opset 20's op) → ShiftGELU or IBertGELU (``--gelu``), requantized
    inside."""

    pattern = Op("Gelu")

    def check(self, lw, m):
        return lw.missing(m.root.inputs[0])

    def rewrite(self, lw, m):
        it, a = lw.symmetric(*lw.per_tensor(*lw.get(m.root.inputs[0])))
        return _variant(lw, m.root, "gelu", GELU)(lw, m.root, it, a)


def _layernorm(kernel: qparams.Kernel):
    """The emitter of a LayerNorm kernel (ILayerNorm, L1LayerNorm): an optional narrowing Requantize, then
    the op with gamma and beta folded."""

    def emit(lw: Lowerer, node: gs.Node, it, a: Affine, gamma, beta) -> Outcome:
        c_len, target = _last_dim(node.inputs[0]), lw.target(node.outputs[0])
        lp = kernel.params(a, c_len, gamma, beta, target, lw.opt.ln_fraction_bits, lw.dyadic)
        if lp.pre is not None:
            it = lw.requantize(it, a, lp.pre, "ln_in")
        inputs = [it, lw.const(lp.multiplier, "mult"), lw.const(lp.shift, "shift"), lw.const(lp.bias, "bias")]
        return _emit(lw, node, kernel.op, inputs, lp.t, **{k: getattr(lp, k) for k in kernel.attrs})

    return emit


#: LayerNorm kernels by ``Options.layernorm``: ``(lw, node, input, type, gamma, beta or None)``
LAYERNORM = {c: _layernorm(k) for c, k in qparams.KERNELS["layernorm"].items()}


class LayerNorm(Rule):
    """LayerNormalization over the last axis with constant gamma/beta → ILayerNorm or L1LayerNorm
    (``--layernorm``; gamma, beta folded)."""

    pattern = Op("LayerNormalization")

    def check(self, lw, m):
        node = m.root
        if lw.missing(node.inputs[0]):
            return lw.missing(node.inputs[0])
        if len(node.inputs) < 2 or lw.const_float(node.inputs[1]) is None:
            return "gamma is not a constant"
        if len(node.inputs) > 2 and node.inputs[2].name and lw.const_float(node.inputs[2]) is None:
            return "beta is not a constant"
        if _last_dim(node.inputs[0]) is None:
            return "the channel count is unknown"
        if not last_axis(node.attrs.get("axis", -1), node.inputs[0]):
            return "not over the last axis"
        return None

    def rewrite(self, lw, m):
        node = m.root
        it, a = lw.get(node.inputs[0])
        gamma = lw.const_float(node.inputs[1])
        beta = lw.const_float(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
        return _variant(lw, node, "layernorm", LAYERNORM)(lw, node, it, a, gamma, beta)
