"""Fake-quant digits ViTs made by real quantization toolkits convert to integer-only graphs.

Each toolkit quantizes the bundled digits ViT with its documented API on the CPU (torch toolkits from
the trained torch model, ONNX toolkits from the bundled FP32 file), and the result is converted in strict
mode: no float tensor left, the expected op counts, top-1 agreement with the fake-quant model >= 99% and
accuracy at most 0.5 point below it on the digits test split. ModelOpt's defaults leave the 10-class head
float (it skips GEMMs with fewer than 16 outputs), so strict mode must refuse it with the reason and
``allow_float`` converts everything else; with that rule off it converts fully. Each test prints one
JSON line with its numbers (``-s``).
"""

from __future__ import annotations

import json
from importlib.metadata import version

import numpy as np
import onnx
import pytest

from ivit_onnx import ConversionError, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import op_counts

torch = pytest.importorskip("torch")

DEPTH = 4  # the bundled digits ViT: 4 blocks, a Conv patch embedding, one head
LINEARS = 4 * DEPTH + 1  # qkv, proj, fc1, fc2 per block, and the head
ATTENTION_MATMULS = 2 * DEPTH
FLOAT_OPS = ("Conv", "Gemm", "Softmax", "LayerNormalization", "Erf", "Gelu", "Tanh")


def _logits(model, x):
    from ivit_onnx.models.runtime import ort_session

    s = ort_session(model)
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _calib(digits, n=512, batch=128):
    return [digits[0][i : i + batch] for i in range(0, n, batch)]


def _compare(fq_path, model, digits, name, tool_version):
    """Agreement and accuracies on the 450 test images; asserts the issue's bounds, prints the numbers."""
    x, y = digits[2], digits[3]
    fq, integer = _logits(str(fq_path), x).argmax(1), _logits(model, x).argmax(1)
    result = {
        "toolkit": name,
        "version": tool_version,
        "agreement": round(float(np.mean(fq == integer)) * 100, 2),
        "fake_quant_accuracy": round(float(np.mean(fq == y)) * 100, 2),
        "integer_accuracy": round(float(np.mean(integer == y)) * 100, 2),
    }
    print("TOOLKIT " + json.dumps(result))
    assert result["agreement"] >= 99.0, result
    # the integer model may not lose more than half a point (it may gain: closer to the float model)
    assert result["integer_accuracy"] >= result["fake_quant_accuracy"] - 0.5, result
    return result


def _strict(fq_path):
    model, report = rewrite(str(fq_path))
    assert float_offenders(model) == []
    assert report.notes["float_islands"] == [] and report.notes["integer_mac_percent"] == 100.0
    counts = op_counts(model)
    assert counts.get("ai.ivit:Shiftmax") == DEPTH and counts.get("ai.ivit:ShiftGELU") == DEPTH
    assert counts.get("ai.ivit:ILayerNorm") == 2 * DEPTH + 1 and counts.get("ConvInteger") == 1
    assert not set(FLOAT_OPS) & set(counts), counts
    return model, counts


def test_brevitas_qcdq_and_qonnx(tmp_path, digits, digits_torch):
    pytest.importorskip("brevitas", reason="brevitas is not installed (pip install -e '.[toolkits]')")
    pytest.importorskip("onnxoptimizer", reason="Brevitas' ONNX export needs onnxoptimizer ('.[toolkits]'; "
                        "skipped on Linux aarch64, which has no wheel of it)")
    from ivit_onnx.models.toolkit_torch import brevitas_export, brevitas_layerwise

    qmodel = brevitas_layerwise(digits_torch, [torch.from_numpy(b) for b in _calib(digits)])
    example = torch.from_numpy(digits[2][:2])
    path, qonnx_path = tmp_path / "brevitas_qcdq.onnx", tmp_path / "brevitas_qonnx.onnx"
    fq = brevitas_export(qmodel, example, path, "qcdq")
    assert {"QuantizeLinear", "Clip", "DequantizeLinear"} <= {n.op_type for n in fq.graph.node}
    model, counts = _strict(path)
    # layer-wise: every Linear/Conv input and weight int8; attention matmuls stay on int32 accumulators
    assert counts["MatMulInteger"] == LINEARS and counts["MatMul"] == ATTENTION_MATMULS
    _compare(path, model, digits, "brevitas", version("brevitas"))
    # the same quantizers as QONNX Quant nodes convert to the same integer model, output for output
    assert {n.op_type for n in brevitas_export(qmodel, example, qonnx_path, "qonnx").graph.node} >= {"Quant"}
    from_qonnx, qonnx_counts = _strict(qonnx_path)
    assert qonnx_counts == counts
    np.testing.assert_array_equal(_logits(from_qonnx, digits[2]), _logits(model, digits[2]))


def test_pt2e_x86_inductor_quantizer(tmp_path, digits, digits_torch):
    pytest.importorskip("torchao", reason="torchao is not installed (pip install -e '.[toolkits]')")
    from ivit_onnx.models.toolkit_torch import pt2e_x86

    path = tmp_path / "pt2e_x86.onnx"
    pt2e_x86(digits_torch, [torch.from_numpy(b) for b in _calib(digits)], path)
    model, counts = _strict(path)
    assert counts["MatMulInteger"] == LINEARS + ATTENTION_MATMULS and "MatMul" not in counts
    _compare(path, model, digits, "pt2e (torchao X86InductorQuantizer)", version("torchao"))


def _onnx_ptq(tool, tmp_path, digits, digits_fp32_path):
    from ivit_onnx.models.toolkit_env import ToolkitEnvError, onnx_ptq

    path = tmp_path / f"{tool}.onnx"
    try:
        versions = onnx_ptq(tool, digits_fp32_path, np.concatenate(_calib(digits)), path)
    except (ToolkitEnvError, OSError) as e:
        pytest.skip(f"isolated toolkit venv could not be built: {e}")
    return path, versions


def test_quark_onnx_ptq(tmp_path, digits, digits_fp32_path):
    path, versions = _onnx_ptq("quark", tmp_path, digits, digits_fp32_path)
    model, counts = _strict(path)
    assert counts["MatMulInteger"] == LINEARS + ATTENTION_MATMULS and "MatMul" not in counts
    _compare(path, model, digits, "quark", versions["version"])


def test_modelopt_onnx_ptq(tmp_path, digits, digits_fp32_path):
    path, versions = _onnx_ptq("modelopt", tmp_path, digits, digits_fp32_path)
    with pytest.raises(
        ConversionError, match=r"Gemm '.*': weight 'head.weight' is float \(no Dequantize"
    ) as e:
        rewrite(str(path))
    assert "\n" not in str(e.value)
    model, report = rewrite(str(path), allow_float=True)
    assert report.notes["float_islands"] == ["Gemm 'node_linear_16'"]
    counts = op_counts(model)
    assert counts["Gemm"] == 1 and counts["MatMulInteger"] == LINEARS - 1 + ATTENTION_MATMULS
    assert counts.get("ai.ivit:Shiftmax") == DEPTH and counts.get("ai.ivit:ILayerNorm") == 2 * DEPTH + 1
    _compare(path, model, digits, "modelopt", versions["version"])


def test_modelopt_defaults_float16_head(tmp_path, digits, digits_fp32_path):
    """ModelOpt with its defaults leaves the head Gemm unquantized and float16: strict mode refuses it naming
    the node; with allow_float the island keeps float16 (a float32 dequantize before it failed the ONNX
    check)."""
    path, versions = _onnx_ptq("modelopt_defaults", tmp_path, digits, digits_fp32_path)
    with pytest.raises(ConversionError, match=r"Gemm '.*'") as e:
        rewrite(str(path))
    assert "\n" not in str(e.value)
    model, report = rewrite(str(path), allow_float=True)
    assert [k.split()[0] for k in report.notes["float_islands"]] == ["Gemm"]
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    inits = {t.name: t for t in model.graph.initializer}
    assert inits[gemm.input[1]].data_type == onnx.TensorProto.FLOAT16
    _compare(path, model, digits, "modelopt (defaults: float16 head)", versions["version"])


def test_modelopt_onnx_ptq_all_gemms(tmp_path, digits, digits_fp32_path):
    """With ``enable_gemv_detection_for_trt=False`` ModelOpt quantizes the head too: fully integer."""
    path, versions = _onnx_ptq("modelopt_all_gemms", tmp_path, digits, digits_fp32_path)
    model, counts = _strict(path)
    assert counts["MatMulInteger"] == LINEARS + ATTENTION_MATMULS and "MatMul" not in counts
    _compare(path, model, digits, "modelopt (enable_gemv_detection_for_trt=False)", versions["version"])
