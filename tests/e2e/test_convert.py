"""Every input kind converts end to end: integer-only, expected op counts, and agreement with the
fake-quant model in onnxruntime on the digits test images, by the house bounds that hold on every CPU
(``models/hf_matrix.py``: cosine and top-1 agreement on the inputs with a margin, an accuracy loss within
chance; docs/testing.md).

The fake-quant model runs its Q/DQ in float, as it defines them (``models.runtime.ort_session``), on every
CPU."""

from __future__ import annotations

import pytest

from ivit_onnx import rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import op_counts

DEPTH = 4  # the bundled digits ViT


def _logits(model_or_path, x):
    from ivit_onnx.models.runtime import ort_session  # opset-21 QDQ models need an ORT workaround

    s = ort_session(model_or_path)
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _failed_bounds(fq_path, int_model, digits) -> list[str]:
    """The house bounds (``hf_matrix.failed_bounds``) the integer model breaks on the digits test split."""
    from ivit_onnx.models import hf_matrix as hm

    result = hm.compare(_logits(str(fq_path), digits[2]), _logits(int_model, digits[2]), digits[3])
    return [f"{why} ({result})" for why in hm.failed_bounds(result)]


def _check_converted(fq_path, digits, expect_tokens_ops=True):
    model, report = rewrite(str(fq_path))
    assert float_offenders(model) == []
    assert report.notes["float_islands"] == [] and report.notes["integer_mac_percent"] == 100.0
    counts = op_counts(model)
    assert counts.get("ai.ivit:Shiftmax") == DEPTH
    assert counts.get("ai.ivit:ShiftGELU") == DEPTH
    assert counts.get("ai.ivit:ILayerNorm") == 2 * DEPTH + 1
    assert counts.get("MatMulInteger", 0) >= 6 * DEPTH
    assert counts.get("ConvInteger") == 1
    for float_op in ("MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "Erf", "Tanh"):
        assert float_op not in counts
    assert _failed_bounds(fq_path, model, digits) == []
    return model, report


def test_own_fake_quant_models(own_fq, digits):
    _, report = _check_converted(own_fq[1], digits)
    if own_fq[0] == "tanh_gelu":
        assert report.counts["fuse_gelu"] == {"GELU (tanh form)": DEPTH}
    if own_fq[0] == "opset14_decomposed_layernorm":
        assert report.counts["fuse_layernorm"] == {"LayerNorm (decomposed)": 2 * DEPTH + 1}


@pytest.mark.parametrize("preprocess", [True, False], ids=["quant_pre_process", "no_pre_process"])
@pytest.mark.parametrize("variant", ["int8_sym", "uint8_asym", "partial"])
def test_onnxruntime_quantize_static_models(variant, preprocess, digits, digits_fp32_path, tmp_path):
    """onnxruntime's ``quantize_static`` with and without the ``quant_pre_process`` its docs recommend
    (shape inference and graph optimizations first: a different graph to convert)."""
    from ivit_onnx.models.ort_qdq import ort_quantize

    x_train = digits[0]
    path = tmp_path / f"ort_{variant}.onnx"
    ort_quantize(digits_fp32_path, path, [x_train[i : i + 128] for i in range(0, 512, 128)], variant=variant,
                 preprocess=preprocess)
    _check_converted(path, digits)


def test_bundled_digits_model_within_the_bounds(digits):
    from ivit_onnx.models.bundled import default_model_path

    model, _ = rewrite(str(default_model_path()))
    assert _failed_bounds(default_model_path(), model, digits) == []
