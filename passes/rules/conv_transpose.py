"""ConvTranspose of an 8-bit input and a constant 8-bit weight in integers (ONNX has no ConvTransposeInteger
and onnxruntime's ConvTranspose is float-only), an exact int32 accumulator typed ``s_x * s_w`` as Conv's.

- one group, no dilation, every axis strided (static spatial shape): blockwise. The kernel, padded to
  ``m = ceil(kernel / stride)`` strides, is ``m`` blocks of one stride; one MatMulInteger over the input
  channels, ``[N, H*W, C_in] @ [C_in, m*C_out*s]``, gives every block's output, each a depth-to-space
  (Reshape/Transpose) shifted by its block index (int32 Pad) and summed (Add); then the pads (Slice) and
  output padding (int32 Pad). kernel == stride (the 2x2 stride-2 upsampling of segmentation heads) is one
  block: no shift, no sum. The MACs are the kernel's padded to whole strides (16 for 9 at 3x3 stride 2).
- anything else (groups, dilations, stride 1): the transposed convolution is the stride-1 convolution of the
  input with ``stride - 1`` zero points inserted between its pixels, padded by ``dilation * (kernel - 1) -
  pad`` (plus the output padding at the end), with the kernel flipped and its channel axes swapped per group:
  Unsqueeze/Pad/Reshape insert the zero points, a Slice crops where a pad exceeds the kernel, ConvInteger
  does the sums (``stride**d`` times the MACs of the ConvTranspose, most of them on zero points).

Weights per output channel (axis 1, onnxruntime's default for ConvTranspose) give a per-channel accumulator;
per input channel (axis 0) only where each group has one input channel (depthwise). auto_pad SAME_* is taken
where its total padding is even (no side gets an extra pixel); the output_shape attribute declines.
"""

from __future__ import annotations

import math

import numpy as np

from ivit_onnx import qparams
from ivit_onnx.affine import Affine
from ivit_onnx.graph import const_array

from ..pattern import Op, Rule
from .linear import _EIGHT_BIT, _finish, _weight_check, _zero_points
from .lowerer import Lowerer


def _auto_pad(node) -> str:
    v = node.attrs.get("auto_pad", "NOTSET")
    return v.decode() if isinstance(v, bytes) else v


def _attrs(node, nd: int, kernel) -> dict:
    """The attributes per spatial axis (pads as begin and end lists; auto_pad SAME_* as the even split of
    the padding that makes the output ``input * stride``)."""
    a = node.attrs
    out = dict(
        strides=list(a.get("strides", [1] * nd)),
        dilations=list(a.get("dilations", [1] * nd)),
        output_padding=list(a.get("output_padding", [0] * nd)),
        kernel=list(a.get("kernel_shape", kernel)),
        group=int(a.get("group", 1)),
    )
    pads = list(a.get("pads", [0] * 2 * nd)) if _auto_pad(node) == "NOTSET" else [0] * 2 * nd
    if _auto_pad(node).startswith("SAME"):
        total = [op + (k - 1) * d + 1 - s for op, k, d, s in
                 zip(out["output_padding"], out["kernel"], out["dilations"], out["strides"], strict=True)]
        pads = [t // 2 for t in total] * 2
        out["total"] = total
    return dict(out, begin=pads[:nd], end=pads[nd:])


def _weight_axis(w: Affine, rank: int) -> int | None:
    """The weight's per-channel axis (None when per tensor)."""
    return None if w.per_tensor else rank - w.scale.ndim


def _why_not(lw: Lowerer, node) -> str | None:
    """Why this ConvTranspose has no integer form here (None when it has one)."""
    why = _weight_check(lw, node)
    if why is not None:
        return why
    x, (iw, w) = lw.get(node.inputs[0])[1], lw.get(node.inputs[1])
    if x.dtype not in _EIGHT_BIT or not x.per_tensor or w.dtype not in _EIGHT_BIT:
        return f"operands are not 8-bit, per-tensor input and weight ({x.dtype}, {w.dtype})"
    if "output_shape" in node.attrs:
        return "the output_shape attribute is not supported (export pads and output_padding)"
    wv = const_array(iw)
    nd = wv.ndim - 2
    a = _attrs(node, nd, wv.shape[2:])
    if any(t % 2 or t < 0 for t in a.get("total", ())):
        return f"auto_pad {_auto_pad(node)} with an odd or negative total padding {a['total']} (export pads)"
    if a["kernel"] != list(wv.shape[2:]) or wv.shape[0] % a["group"]:
        return f"kernel_shape {a['kernel']} or group {a['group']} does not match the weight {list(wv.shape)}"
    axis = _weight_axis(w, wv.ndim)
    if axis == 0 and wv.shape[0] != a["group"]:
        return "weights quantized per input channel (axis 0) with several input channels per group"
    if axis not in (None, 0, 1):
        return f"weights quantized per channel along axis {axis} (only 1, the output channels, or 0)"
    if a["strides"] != [1] * nd and _spatial(node) is None:
        return "a strided ConvTranspose needs a static spatial input shape"
    return None


def _spatial(node) -> list[int] | None:
    """The input's static spatial shape (None where a dimension is symbolic or unknown)."""
    shape = node.inputs[0].shape
    sp = list(shape[2:]) if shape is not None else None
    return sp if sp is not None and all(isinstance(d, int) and d > 0 for d in sp) else None


def _accumulator(x: Affine, w: Affine, wv: np.ndarray, a: dict) -> Affine:
    """The int32 type: ``s_x * s_w`` per output channel (weight axis 1 repeats over the groups, axis 0 is one
    input channel per group), bounded by the taps that can meet input pixels (``ceil(k / (s / gcd(s, d)))``
    per axis)."""
    nd, g = wv.ndim - 2, a["group"]
    taps = wv.shape[0] // g * math.prod(
        min(k, -(-k // (s // math.gcd(s, d))))
        for k, s, d in zip(a["kernel"], a["strides"], a["dilations"], strict=True)
    )
    axis = _weight_axis(w, wv.ndim)
    if axis is None:
        return qparams.conv_accumulator(x, w, taps, nd)
    s = w.scale.reshape(-1)
    per_out = np.tile(s, g) if axis == 1 else np.repeat(s, wv.shape[1])
    return qparams.conv_accumulator(x, Affine(per_out, w.zero_point, w.dtype, w.bound), taps, nd)


def _is_blockwise(node, a: dict, nd: int) -> bool:
    """One group, no dilation, every axis strided and a static spatial shape: the MatMulInteger form (its
    Reshapes need the shape; at stride 1 the ConvInteger wastes nothing)."""
    return (
        _spatial(node) is not None
        and a["group"] == 1
        and a["dilations"] == [1] * nd
        and all(s > 1 for s in a["strides"])
    )


def _crop(lw: Lowerer, it, dtype, begin, end, hint: str):
    """``it`` less ``begin``/``end`` elements at the ends of its spatial axes (no-op if none)."""
    if not any(begin) and not any(end):
        return it
    nd = len(begin)
    starts = np.array(begin, np.int64)
    ends = np.array([-e if e else np.iinfo(np.int64).max for e in end], np.int64)
    axes = np.arange(2, 2 + nd, dtype=np.int64)
    args = [lw.const(starts, "starts"), lw.const(ends, "ends"), lw.const(axes, "axes")]
    return lw.node("Slice", [it, *args], dtype, hint)


def _zeros_padded(lw: Lowerer, it, pads: np.ndarray, hint: str):
    """An int32 tensor padded with zeros (real zeros: the accumulator has zero point 0)."""
    return lw.node("Pad", [it, lw.const(pads, "pads")], np.int32, hint, attrs={"mode": "constant"})


def _blockwise(lw: Lowerer, ix, sp, x: Affine, w: Affine, wv: np.ndarray, a: dict):
    """The kernel padded (with the weight's zero point) to ``m * stride`` per axis and cut into ``m`` blocks
    of one stride each: ``[N,*S,C] @ [C, (m..., O, s...)]`` gives every block's output, each block is a
    depth-to-space shifted by its block index in input pixels, their int32 sum the full output; then the
    pads."""
    cin, cout, ks, st = wv.shape[0], wv.shape[1], list(wv.shape[2:]), a["strides"]
    nd = len(ks)
    ms = [-(-k // s) for k, s in zip(ks, st, strict=True)]
    wp = np.pad(wv, [(0, 0), (0, 0)] + [(0, m * s - k) for m, s, k in zip(ms, st, ks, strict=True)],
                constant_values=w.zero_point)
    wp = wp.reshape(cin, cout, *(d for m, s in zip(ms, st, strict=True) for d in (m, s)))
    # [C, O, m_0, s_0, m_1, s_1, ...] -> [C, m_0, m_1, ..., O, s_0, s_1, ...]
    order = [0, *(2 + 2 * i for i in range(nd)), 1, *(3 + 2 * i for i in range(nd))]
    wm = lw.const(np.ascontiguousarray(wp.transpose(order).reshape(cin, -1)), "weight")
    rows = lw.node("Transpose", [ix], x.dtype, "to_rows", attrs={"perm": [0, *range(2, 2 + nd), 1]})
    y = lw.node("MatMulInteger", [rows, wm, *_zero_points(lw, x, w)], np.int32, "conv_transpose")
    lw.ctx.count("lower_integer", "MatMulInteger")
    shape = lw.const(np.array([0, *sp, *ms, cout, *st], np.int64), "shape")
    y = lw.node("Reshape", [y, shape], np.int32, "blocks")  # [N, *S, *m, O, *s]
    total = None
    for block in np.ndindex(*ms):  # block ``b`` lands ``b`` input pixels further along each axis
        part = y
        if math.prod(ms) > 1:
            starts, axes = np.array(block, np.int64), np.arange(1 + nd, 1 + 2 * nd, dtype=np.int64)
            args = [lw.const(starts, "starts"), lw.const(starts + 1, "ends"), lw.const(axes, "axes")]
            part = lw.node("Slice", [y, *args], np.int32, "block")
            rank = 2 + 3 * nd
            pads = np.zeros(2 * rank, np.int64)
            pads[1 : 1 + nd] = block
            pads[rank + 1 : rank + 1 + nd] = np.array(ms) - 1 - np.array(block)
            part = _zeros_padded(lw, part, pads, "shift")
        total = part if total is None else lw.node("Add", [total, part], np.int32, "overlap")
    # [N, *J, 1..., O, *s] -> [N, 1..., O, J_0, s_0, J_1, s_1, ...] (the Reshape drops the 1s)
    perm = [0, *range(1 + nd, 2 + 2 * nd)] + [p for i in range(nd) for p in (1 + i, 2 + 2 * nd + i)]
    y = lw.node("Transpose", [total], np.int32, "depth_to_space", attrs={"perm": perm})
    full = [(n + m - 1) * s for n, m, s in zip(sp, ms, st, strict=True)]
    y = lw.node("Reshape", [y, lw.const(np.array([0, cout, *full], np.int64), "shape")], np.int32, "image")
    # the output: ``[begin, begin + length)`` of the full one, zeros past its end (output padding)
    length = [(n - 1) * s + k + op - b - e for n, s, k, op, b, e in
              zip(sp, st, ks, a["output_padding"], a["begin"], a["end"], strict=True)]
    over = [b + n - f for b, n, f in zip(a["begin"], length, full, strict=True)]
    if max(over) > 0:
        pads = np.zeros(2 * (2 + nd), np.int64)
        pads[4 + nd :] = np.maximum(over, 0)
        y = _zeros_padded(lw, y, pads, "output_padding")
    return _crop(lw, y, np.int32, a["begin"], [max(-o, 0) for o in over], "pads")


def _zero_inserted(lw: Lowerer, ix, x: Affine, sp: list[int], strides: list[int]):
    """``ix`` with ``s - 1`` zero points after each pixel along each spatial axis (length ``L * s``)."""
    nd = len(strides)
    axes = np.array([3 + 2 * i for i in range(nd)], np.int64)
    y = lw.node("Unsqueeze", [ix, lw.const(axes, "axes")], x.dtype, "interleave")
    pads = np.zeros(2 * (2 + 2 * nd), np.int64)
    pads[2 + 2 * nd + axes] = np.array(strides) - 1
    y = lw.node("Pad", [y, lw.const(pads, "pads"), lw.zp(x.zero_point, x.dtype, "value")], x.dtype, "zeros",
                attrs={"mode": "constant"})
    shape = np.array([0, 0, *(s * d for s, d in zip(sp, strides, strict=True))], np.int64)
    return lw.node("Reshape", [y, lw.const(shape, "shape")], x.dtype, "dilated")


def _as_conv(lw: Lowerer, ix, sp, x: Affine, w: Affine, wv: np.ndarray, a: dict):
    """The stride-1 ConvInteger of the zero-inserted input with the flipped, channel-swapped kernel."""
    nd, g = wv.ndim - 2, a["group"]
    cin, cout_g, ks = wv.shape[0], wv.shape[1], list(wv.shape[2:])
    wc = wv.reshape(g, cin // g, cout_g, *ks).swapaxes(1, 2).reshape(g * cout_g, cin // g, *ks)
    wc = np.ascontiguousarray(np.flip(wc, axis=tuple(range(2, 2 + nd))))
    strided = a["strides"] != [1] * nd
    it = _zero_inserted(lw, ix, x, sp, a["strides"]) if strided else ix
    reach = [d * (k - 1) for d, k in zip(a["dilations"], ks, strict=True)]
    extra = [s - 1 for s in a["strides"]]  # the zero points after the last pixel
    begin = [r - p for r, p in zip(reach, a["begin"], strict=True)]
    end = [r - p + op - e for r, p, op, e in zip(reach, a["end"], a["output_padding"], extra, strict=True)]
    it = _crop(lw, it, x.dtype, [max(-b, 0) for b in begin], [max(-e, 0) for e in end], "crop")
    attrs = dict(
        kernel_shape=ks,
        dilations=a["dilations"],
        group=g,
        pads=[max(b, 0) for b in begin] + [max(e, 0) for e in end],
    )
    zps = _zero_points(lw, x, w)
    return lw.node("ConvInteger", [it, lw.const(wc, "weight"), *zps], np.int32, "conv_transpose", attrs=attrs)


class ConvTranspose(Rule):
    """ConvTranspose of an 8-bit per-tensor input and a constant 8-bit weight → one MatMulInteger and
    shifted depth-to-space blocks (one group, no dilation, strided), else ConvInteger of the zero-inserted
    input (+ int32 bias Add)."""

    pattern = Op("ConvTranspose")

    def check(self, lw, m):
        return _why_not(lw, m.root)

    def rewrite(self, lw, m):
        node = m.root
        (ix, x), (iw, w) = lw.get(node.inputs[0]), lw.get(node.inputs[1])
        wv = const_array(iw)
        nd = wv.ndim - 2
        a = _attrs(node, nd, wv.shape[2:])
        if _is_blockwise(node, a, nd):
            out = _blockwise(lw, ix, _spatial(node), x, w, wv, a)
            lw.ctx.count("lower_integer", "ConvTranspose as MatMulInteger (blockwise)")
        else:
            out = _as_conv(lw, ix, _spatial(node), x, w, wv, a)
            lw.ctx.count("lower_integer", "ConvTranspose as ConvInteger (zero-inserted)")
        out.shape = node.outputs[0].shape
        return _finish(lw, node, out, _accumulator(x, w, wv, a), bias_shape=[-1] + [1] * nd)
