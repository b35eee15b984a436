"""QDQ models from onnxruntime's quantize_static: the three variants load, run and stay close to FP32."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest

pytest.importorskip("torch")

from ivit_onnx.models.ort_qdq import ort_quantize  # noqa: E402
from ivit_onnx.models.runtime import cosine, run_onnx  # noqa: E402

from .conftest import zero_point_types  # noqa: E402


def inputs_from_dq(model: onnx.ModelProto) -> Counter:
    """How many inputs of each op type come from a DequantizeLinear."""
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return Counter(
        n.op_type
        for n in model.graph.node
        for i in n.input
        if i in dq_outputs and n.op_type not in ("QuantizeLinear", "DequantizeLinear")
    )


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize(
    "variant, activation_type",
    [("int8_sym", "INT8"), ("uint8_asym", "UINT8"), ("partial", "INT8")],
)
def test_variants(tmp_path, exports, calib_np, x, exporter, variant, activation_type):
    fp32 = exports[exporter, "fp32"]
    model = ort_quantize(fp32, tmp_path / f"{variant}.onnx", calib_np, variant)
    assert model.ir_version <= 10
    types = zero_point_types(model)
    assert activation_type in types and "INT8" in types  # weights are int8 in every variant
    consumers = inputs_from_dq(model)
    assert {"MatMul", "Gemm", "Conv"} <= set(consumers)
    if variant == "partial":  # only inputs of MatMul/Gemm/Conv (and a Shape sharing the image's DQ)
        assert set(consumers) - {"Shape"} == {"MatMul", "Gemm", "Conv"}
    else:
        assert {"Add", "Softmax", "LayerNormalization"} <= set(consumers)
    assert cosine(run_onnx(model, x.numpy()), run_onnx(fp32, x.numpy())) > 0.9


def test_unknown_variant(tmp_path, exports, calib_np):
    with pytest.raises(ValueError, match="variant"):
        ort_quantize(exports["torchscript", "fp32"], tmp_path / "m.onnx", calib_np, "int4")
