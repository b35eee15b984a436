"""opset/reference.py's QuantizeLinear/DequantizeLinear (opset < 19) match onnxruntime bit for bit."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.runners import ReferenceRunner

RNG = np.random.default_rng(0)


def _qdq_model(opset: int, dtype, per_axis: bool, with_zp: bool = True):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5])
    scale = (RNG.uniform(0.01, 0.2, 4) if per_axis else np.float32(0.05)).astype(np.float32)
    zp = (RNG.integers(-3, 4, 4) if per_axis else np.array(3)).astype(dtype)
    if dtype == np.uint8:
        zp = zp + np.asarray(100, dtype)
    inits = [numpy_helper.from_array(scale, "s")] + ([numpy_helper.from_array(zp, "z")] if with_zp else [])
    ins = ["s", "z"] if with_zp else ["s"]
    nodes = [helper.make_node("QuantizeLinear", ["x", *ins], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", *ins], ["y"], axis=1)]
    qtype = TensorProto.INT8 if dtype == np.int8 else TensorProto.UINT8
    outs = [helper.make_tensor_value_info("q", qtype, None), helper.make_tensor_value_info("y", 1, None)]
    g = helper.make_graph(nodes, "qdq", [x], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_qdq_matches_onnxruntime(opset, dtype, per_axis):
    m = _qdq_model(opset, dtype, per_axis)
    x = (RNG.standard_normal((2, 4, 5)) * 4).astype(np.float32)
    x.flat[:6] = [0.025, -0.075, 0.125, 1e9, -1e9, 0.0]  # ties (half to even) and saturation
    ref = ReferenceRunner(m).run({"x": x}).values()  # opset/reference.py's evaluator
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, b in zip(ref, got, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_missing_zero_point_means_uint8_zero():
    m = _qdq_model(17, np.uint8, False, with_zp=False)
    out = ReferenceRunner(m).run({"x": np.full((2, 4, 5), -1.0, np.float32)})
    q, y = out["q"], out["y"]
    assert q.dtype == np.uint8 and np.all(q == 0) and np.all(y == 0)
