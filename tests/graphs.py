"""Tiny ONNX graphs built in code for the pass tests (QDQ helpers, float patterns)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class G:
    """A little graph builder: ``g.node(op, inputs, **attrs)`` returns the output name."""

    def __init__(self, opset: int = 17):
        self.opset = opset
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.shapes = {}
        self.n = 0

    def name(self, hint="t"):
        self.n += 1
        return f"{hint}{self.n}"

    def input(self, name, shape, dtype=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    def const(self, value, dtype=np.float32, hint="c"):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op, inputs, n_out=1, domain="", **attrs):
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name(op), domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def qdq(self, x, scale, zp=0, dtype=np.int8):
        s, z = self.const(scale), self.const(zp, dtype)
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, s, z]), s, z])

    def weight(self, w, axis=0, dtype=np.int8):
        """A per-channel symmetric int8 weight as int8 initializer → DequantizeLinear."""
        w = np.asarray(w, np.float32)
        red = tuple(i for i in range(w.ndim) if i != axis)
        scale = np.maximum(np.abs(w).max(axis=red), 1e-8) / 127
        shape = [1] * w.ndim
        shape[axis] = -1
        q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(dtype)
        return self.node(
            "DequantizeLinear",
            [self.const(q, dtype), self.const(scale), self.const(np.zeros_like(scale, dtype=dtype), dtype)],
            axis=axis,
        )

    def output(self, name, shape=None):
        """A graph output; its type from shape inference, or float32 ``shape`` where inference cannot tell
        (after an op of another domain)."""
        self.outputs.append(name)
        if shape is not None:
            self.shapes[name] = shape

    def model(self):
        """The model; output types come from shape inference."""
        g = helper.make_graph(self.nodes, "test", self.inputs, [], initializer=self.inits)
        domains = sorted({n.domain for n in self.nodes} - {""})  # e.g. QONNX's Quant
        opsets = [helper.make_opsetid("", self.opset), *(helper.make_opsetid(d, 1) for d in domains)]
        m = helper.make_model(g, opset_imports=opsets, ir_version=10)
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
        typed = {o: helper.make_tensor_value_info(o, TensorProto.FLOAT, s) for o, s in self.shapes.items()}
        m.graph.output.extend(typed.get(o) or inferred[o] for o in self.outputs)
        onnx.checker.check_model(m)
        return m


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """Stock onnxruntime, exact on every CPU: a fake-quant model's Q/DQ in float, a converted model's uint8 x
    int8 weight GEMMs on the exact kernels (both saturate without VNNI otherwise)."""
    import onnxruntime as ort

    from ivit_onnx.runners import exact_weight_gemms, simulate_qdq

    opts = ort.SessionOptions()
    simulate_qdq(opts)
    exact_weight_gemms(opts)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in model.graph.node:
        key = f"{n.domain}:{n.op_type}" if n.domain else n.op_type
        out[key] = out.get(key, 0) + 1
    return out
