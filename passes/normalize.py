"""normalize: validate QDQ scales, fold Constant nodes and constant QuantizeLinear, drop Identity/Dropout.

Guarantees every Q/DQ has a constant, finite, positive scale and a constant zero point, and that
quantized weights are integer initializers (torch exports float weight → Q → DQ).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import const_array, node_label, replace_uses
from ivit_onnx.io import quantize
from ivit_onnx.pipeline import Context, Pass

_QDQ = ("QuantizeLinear", "DequantizeLinear")


class Normalize(Pass):
    name = "normalize"
    guarantees = ("constant_qdq_params", "no_constant_nodes")

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        if ctx.opset < 13:
            raise ConversionError(f"opset {ctx.opset} is too old: ivit-onnx needs opset 13 or newer")
        if not any(n.op in _QDQ for n in g.nodes):
            raise ConversionError("no QuantizeLinear/DequantizeLinear nodes: not a fake-quant (QDQ) model")
        changed = self._fold_constant_nodes(ctx)
        for node in list(g.nodes):
            if node.op in ("Identity", "Dropout") and node.outputs:
                self._bypass(ctx, node)
                changed = True
        for node in g.nodes:
            if node.op in _QDQ:
                self._check_params(node)
        for node in list(g.nodes):
            if node.op == "QuantizeLinear" and const_array(node.inputs[0]) is not None:
                self._fold_quantize(ctx, node)
                changed = True
        g.cleanup().toposort()
        return changed

    def _fold_constant_nodes(self, ctx: Context) -> bool:
        changed = False
        for node in ctx.graph.nodes:
            if node.op == "Constant" and "value" in node.attrs:
                out = node.outputs[0]
                const = gs.Constant(out.name + "_c", np.asarray(node.attrs["value"].values))
                if out in ctx.graph.outputs:
                    continue
                replace_uses(out, const)
                node.outputs.clear()
                ctx.count(self.name, "Constant folded")
                changed = True
        return changed

    @staticmethod
    def _check_params(node: gs.Node) -> None:
        where = node_label(node)
        if len(node.inputs) < 2:
            raise ConversionError(f"{where}: missing scale input")
        scale = const_array(node.inputs[1])
        if scale is None:
            raise ConversionError(f"{where}: scale '{node.inputs[1].name}' is not a constant")
        if not np.all(np.isfinite(scale)):
            raise ConversionError(
                f"{where}: scale '{node.inputs[1].name}' is not finite ({scale.ravel()[:4]})"
            )
        if np.any(scale <= 0):
            raise ConversionError(
                f"{where}: scale '{node.inputs[1].name}' must be positive, "
                f"got {scale.ravel()[np.argmin(scale.ravel())]:g}"
            )
        if len(node.inputs) > 2 and node.inputs[2].name and const_array(node.inputs[2]) is None:
            raise ConversionError(f"{where}: zero point '{node.inputs[2].name}' is not a constant")
        if node.op == "QuantizeLinear":
            zp = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
            dt = np.dtype(zp.dtype) if zp is not None else np.dtype(np.uint8)
            if dt not in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16)):
                raise ConversionError(f"{where}: unsupported quantized type {dt.name}")

    def _fold_quantize(self, ctx: Context, node: gs.Node) -> None:
        x = const_array(node.inputs[0])
        scale = const_array(node.inputs[1])
        zp = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2].name else None
        zp = np.zeros((), np.uint8) if zp is None else zp
        q = quantize(x, scale, zp, node.attrs.get("axis", 1))
        out = node.outputs[0]
        const = gs.Constant(out.name + "_q", q)
        replace_uses(out, const)
        node.outputs.clear()
        ctx.count(self.name, "QuantizeLinear of constant folded")

    def _bypass(self, ctx: Context, node: gs.Node) -> None:
        src, out = node.inputs[0], node.outputs[0]
        if out in ctx.graph.outputs:
            return
        replace_uses(out, src)
        node.outputs.clear()
        ctx.count(self.name, f"{node.op} removed")
