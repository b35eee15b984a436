"""ConvInteger as a GEMM, shared by both engines: TVM's ONNX frontend has no ConvInteger, and onnxruntime's
runs a patch embedding several times slower than the same sums as a MatMulInteger.

Patch embeddings (2-D, stride == kernel, no padding, no dilation, one group, constant weights) become
Reshape/Transpose + MatMulInteger, keeping the operands 8-bit; any other ConvInteger becomes an int32
``Conv`` of zero-point-shifted operands (ONNX types Conv as float-only, so that form is for TVM only).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.graph import node_attrs


class _Emitter:
    """Collects the replacement nodes and initializers of one ConvInteger under unique names."""

    def __init__(self, graph: onnx.GraphProto, base: str):
        self.graph, self.base, self.nodes, self.inits, self._n = graph, base, [], [], 0
        self.taken = {o for n in graph.node for o in n.output} | {i.name for i in graph.initializer}

    def name(self, hint: str) -> str:
        while True:
            self._n += 1
            name = f"{self.base}/{hint}_{self._n}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type), **attrs))
        return out

    def const(self, arr: np.ndarray, hint: str) -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name


def _static_shape(vi: onnx.ValueInfoProto | None) -> list[int] | None:
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = vi.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else None for d in dims]


def _is_patch_conv(attrs: dict, w: np.ndarray | None, x_shape: list | None) -> bool:
    if w is None or w.ndim != 4 or x_shape is None or len(x_shape) != 4 or None in x_shape[1:]:
        return False
    k = list(w.shape[2:])
    return (attrs.get("group", 1) == 1 and list(attrs.get("strides", [1, 1])) == k
            and list(attrs.get("kernel_shape", k)) == k and set(attrs.get("dilations", [1, 1])) == {1}
            and set(attrs.get("pads", [0, 0, 0, 0])) == {0}
            and attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", b"VALID"))


def _patch_matmul(e: _Emitter, node: onnx.NodeProto, w: np.ndarray, x_shape: list) -> None:
    """``[N,C,H,W] -> [N, Ho*Wo, C*kh*kw] @ [C*kh*kw, O] -> [N,O,Ho,Wo]``; weights re-laid-out here."""
    o, c, kh, kw = w.shape
    ho, wo = x_shape[2] // kh, x_shape[3] // kw
    x = node.input[0]
    if x_shape[2] != ho * kh or x_shape[3] != wo * kw:  # a strided conv drops the remainder rows/columns
        x = e.op("Slice", [x, e.const(np.array([0, 0], np.int64), "starts"),
                           e.const(np.array([ho * kh, wo * kw], np.int64), "ends"),
                           e.const(np.array([2, 3], np.int64), "axes")])
    x = e.op("Reshape", [x, e.const(np.array([0, c, ho, kh, wo, kw], np.int64), "shape")])
    x = e.op("Transpose", [x], perm=[0, 2, 4, 1, 3, 5])
    x = e.op("Reshape", [x, e.const(np.array([0, ho * wo, c * kh * kw], np.int64), "shape")])
    wm = e.const(np.ascontiguousarray(w.reshape(o, c * kh * kw).T), "weight")
    zps = list(node.input[2:4]) + [""] * (4 - len(node.input))
    y = e.op("MatMulInteger", [x, wm] + zps[:2])
    y = e.op("Transpose", [y], perm=[0, 2, 1])
    e.op("Reshape", [y, e.const(np.array([0, o, ho, wo], np.int64), "shape")], out=node.output[0])


def _int32_conv(e: _Emitter, node: onnx.NodeProto, attrs: dict) -> None:
    """``Conv(int32(x) - x_zp, int32(w) - w_zp)``, original attributes (zero padding == padding by zp)."""
    i32 = TensorProto.INT32
    inputs = list(node.input) + [""] * (4 - len(node.input))
    x = e.op("Cast", [inputs[0]], to=i32)
    if inputs[2]:
        x = e.op("Sub", [x, e.op("Cast", [inputs[2]], to=i32)])
    w = e.op("Cast", [inputs[1]], to=i32)
    if inputs[3]:  # scalar, or [O] per output channel: broadcast over [O, C, kh, kw]
        per_channel = e.const(np.array([-1, 1, 1, 1], np.int64), "shape")
        zp = e.op("Reshape", [e.op("Cast", [inputs[3]], to=i32), per_channel])
        w = e.op("Sub", [w, zp])
    e.op("Conv", [x, w], out=node.output[0], **attrs)


def _scalar_weight_zero_point(node: onnx.NodeProto, inits: dict) -> bool:
    """No weight zero point, or a constant scalar one."""
    if len(node.input) < 4 or not node.input[3]:
        return True
    return node.input[3] in inits and int(np.prod(inits[node.input[3]].dims)) == 1


def rewrite_conv_integer(model: onnx.ModelProto, patches_only: bool = False) -> int:
    """Replace every top-level ConvInteger in place; returns how many were rewritten.

    ``patches_only`` rewrites just the patch embeddings with a scalar weight zero point, whose form is
    standard ONNX that onnxruntime runs too (:mod:`ivit_onnx.engines.onnxruntime.patch_gemm`), and leaves
    the others."""
    graph = model.graph
    if not any(n.op_type == "ConvInteger" for n in graph.node):
        return 0
    inits = {i.name: i for i in graph.initializer}
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    infos = {v.name: v for v in list(inferred.input) + list(inferred.value_info) + list(inferred.output)}
    new_nodes, count = [], 0
    for node in graph.node:
        if node.op_type != "ConvInteger":
            new_nodes.append(node)
            continue
        e = _Emitter(graph, node.name or node.output[0])
        attrs = node_attrs(node)
        w = numpy_helper.to_array(inits[node.input[1]]) if node.input[1] in inits else None
        x_shape = _static_shape(infos.get(node.input[0]))
        if _is_patch_conv(attrs, w, x_shape) and (not patches_only or _scalar_weight_zero_point(node, inits)):
            _patch_matmul(e, node, w, x_shape)
        elif patches_only:
            new_nodes.append(node)
            continue
        else:
            _int32_conv(e, node, attrs)
        new_nodes += e.nodes
        graph.initializer.extend(e.inits)
        count += 1
    del graph.node[:]
    graph.node.extend(new_nodes)
    return count
