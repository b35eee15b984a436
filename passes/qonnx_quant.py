"""QONNX ``Quant`` (Brevitas' ``export_qonnx``) rewritten as QuantizeLinear → [Clip] → DequantizeLinear.

``Quant(x, scale, zeropt, bitwidth; signed, narrow, rounding_mode)`` is
``(clip(round(x / scale + zeropt), lo, hi) - zeropt) * scale``, with ``lo, hi`` from the bit width,
signedness and narrow range. For 2..8 bits (2..16 at opset 21) with ``rounding_mode="ROUND"`` (half to
even, as QuantizeLinear) that is exactly QuantizeLinear into an 8-bit (16-bit) integer, a Clip to
``[lo, hi]`` when the range is narrower than the type's, and DequantizeLinear. Other forms stop with one
line naming the node.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import const_array, constant, node_label, replace_uses

QONNX_DOMAINS = ("qonnx.custom_op.general", "finn.custom_op.general", "onnx.brevitas")


def is_qonnx(node: gs.Node) -> bool:
    return node.domain in QONNX_DOMAINS


def _params(node: gs.Node, top: int):
    """(scale, integer zero point, lo, hi, container dtype), or ConversionError naming the form."""
    where = node_label(node)
    if node.op != "Quant":
        raise ConversionError(f"{where}: QONNX {node.op} has no integer-only form here (only Quant)")
    values = [const_array(t) for t in node.inputs[1:4]]
    if len(values) < 3 or any(v is None for v in values):
        raise ConversionError(f"{where}: QONNX Quant needs constant scale, zero point and bit width")
    scale, zp, bits = (np.asarray(v, np.float64) for v in values)
    mode = node.attrs.get("rounding_mode", "ROUND")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode.upper() != "ROUND":
        raise ConversionError(f"{where}: QONNX Quant rounding_mode {mode} is not supported (only ROUND)")
    n = float(bits.reshape(-1)[0])
    if bits.size != 1 or n != int(n) or not 2 <= n <= top:
        raise ConversionError(f"{where}: QONNX Quant of {n:g} bits is not supported here (2..{top} bits)")
    if np.any(zp != np.rint(zp)):
        raise ConversionError(f"{where}: QONNX Quant zero point is not an integer")
    signed, narrow, n = bool(node.attrs.get("signed", 1)), int(node.attrs.get("narrow", 0)), int(n)
    lo, hi = (-(2 ** (n - 1)) + narrow, 2 ** (n - 1) - 1) if signed else (0, 2**n - 1 - narrow)
    width = 8 if n <= 8 else 16 if n <= 16 else 32
    dtype = np.dtype(f"{'' if signed else 'u'}int{width}")
    return scale, zp.astype(dtype), lo, hi, dtype


def _axis(node: gs.Node, scale: np.ndarray) -> int | None:
    """The channel axis of a broadcastable per-channel scale (QONNX shapes it like ``[C, 1, 1, 1]``)."""
    if scale.size == 1:
        return None
    x = node.inputs[0]
    rank = (
        len(x.shape)
        if x.shape is not None
        else len(const_array(x).shape)
        if const_array(x) is not None
        else None
    )
    channel = [i for i, d in enumerate(scale.shape) if d != 1]
    if rank is None or len(channel) != 1:
        raise ConversionError(
            f"{node_label(node)}: QONNX Quant scale of shape {scale.shape} is not per tensor or per channel"
        )
    return rank - scale.ndim + channel[0]


def rewrite_quant(graph: gs.Graph, node: gs.Node, opset: int) -> None:
    """Replace one QONNX node by its QuantizeLinear → [Clip] → DequantizeLinear equivalent."""
    x = const_array(node.inputs[0])
    scale, zp, lo, hi, dtype = _params(node, 32 if x is not None else 16 if opset >= 21 else 8)
    axis = _axis(node, scale)
    if x is not None and dtype.itemsize == 4:  # a 32-bit bias: its fake-quant value, folded here
        q = np.clip(np.rint(x / scale + zp), lo, hi)
        replace_uses(
            node.outputs[0], constant(f"{node.outputs[0].name}_c", ((q - zp) * scale).astype(np.float32))
        )
        node.outputs.clear()
        return
    name = node.name or node.outputs[0].name
    shape, n = ((-1,), None) if axis is not None else ((), 1)
    s = gs.Constant(f"{name}/scale", scale.astype(np.float32).reshape(-1)[:n].reshape(shape))
    zp = np.broadcast_to(zp, scale.shape) if zp.size == 1 else zp  # QuantizeLinear: zp shaped as scale
    z = gs.Constant(f"{name}/zero_point", np.ascontiguousarray(zp).reshape(-1)[:n].reshape(shape))
    attrs = {"axis": axis} if axis is not None else {}
    q = gs.Variable(f"{name}/q", dtype=dtype)
    graph.nodes.append(gs.Node("QuantizeLinear", f"{name}/quantize", attrs, [node.inputs[0], s, z], [q]))
    info = np.iinfo(dtype)
    if (lo, hi) != (info.min, info.max):
        c = gs.Variable(f"{name}/clipped", dtype=dtype)
        bounds = [gs.Constant(f"{name}/{k}", np.array(v, dtype)) for k, v in (("lo", lo), ("hi", hi))]
        graph.nodes.append(gs.Node("Clip", f"{name}/clip", {}, [q, *bounds], [c]))
        q = c
    out = node.outputs[0]
    node.outputs.clear()
    graph.nodes.append(gs.Node("DequantizeLinear", f"{name}/dequantize", attrs, [q, s, z], [out]))
