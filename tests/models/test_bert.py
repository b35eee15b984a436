"""The BERT-style encoder (models/bert.py): deterministic, exportable, quantized by onnxruntime's
``quantize_static`` (QDQ, int8 symmetric, per-channel). Calibrated on padded inputs, onnxruntime quantizes the
mask arithmetic itself (the masked scores before Softmax get a scale covering -10000 or finfo.min), which the
converter refuses in one line; the project's own fake-quant export converts in strict mode
(test_bert_strict.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
import onnxruntime as ort  # noqa: E402

from ivit_onnx import ConversionError, rewrite  # noqa: E402
from ivit_onnx.models.bert import bert_tiny, export_bert, quantize_bert  # noqa: E402


def _run(model, feeds):
    blob = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.fixture(scope="module")
def berts(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    out = {}
    for form, opset in (("arith", 17), ("where", 18)):
        fp32, fq = d / f"{form}_fp32.onnx", d / f"{form}_fq.onnx"
        export_bert(bert_tiny(mask_form=form), fp32, opset=opset)
        quantize_bert(fp32, fq)
        out[form] = fq
    return out


def test_deterministic_with_hf_names():
    a, b = bert_tiny(seed=3).state_dict(), bert_tiny(seed=3).state_dict()
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    for name in (
        "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "encoder.layer.1.attention.self.query.weight",
        "encoder.layer.0.attention.output.LayerNorm.bias",
        "encoder.layer.0.intermediate.dense.weight",
        "encoder.layer.0.output.dense.weight",
        "classifier.weight",
    ):
        assert name in a, name


def test_quantized_with_qdq_per_channel(berts):
    m = onnx.load(berts["arith"])
    ops = {n.op_type for n in m.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Gather", "Erf", "Softmax"} <= ops
    assert [i.type.tensor_type.elem_type for i in m.graph.input] == [onnx.TensorProto.INT64] * 3
    per_channel = [
        n
        for n in m.graph.node
        if n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute)
    ]
    assert per_channel


@pytest.mark.parametrize("form, fill", [("arith", "-1e+04"), ("where", "-3.4e+38")])
@pytest.mark.parametrize("allow_float", [False, True])
def test_quantized_mask_is_refused_in_one_line(berts, form, fill, allow_float):
    """onnxruntime calibrated the scores plus the mask on padded inputs: the fake-quant model flattens every
    unmasked score, so no conversion can match it; the refusal names the tensor, its scale, the mask's fill
    value and the recipe, in strict mode and with allow_float alike."""
    with pytest.raises(ConversionError) as e:
        rewrite(berts[form], allow_float=allow_float)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert "attention/self/Add_output_0' is the attention scores plus the mask" in msg, msg
    assert f"fill value {fill}" in msg and "docs/conversion.md#attention-masks-and-quantizers" in msg, msg


@pytest.mark.parametrize("form, opset", [("arith", 17), ("where", 18)])
def test_mask_recipe_converts_strictly(tmp_path, form, opset):
    """With the attention mask's nodes left float (``exclude_mask``) the same export converts in strict mode
    and agrees with its fake-quant model."""
    from ivit_onnx.certify import float_offenders
    from ivit_onnx.models.bert import BertConfig, example_inputs

    fp32, fq = tmp_path / "fp32.onnx", tmp_path / "fq.onnx"
    export_bert(bert_tiny(mask_form=form), fp32, opset=opset)
    quantize_bert(fp32, fq, exclude_mask=True)
    model, _ = rewrite(fq)
    assert float_offenders(model) == []
    feeds = example_inputs(BertConfig(), batch=4, seq=8, seed=5)
    ref, got = _run(fq, feeds), _run(model, feeds)
    assert got.shape == ref.shape == (4, 3)
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max() + 1e-6


def test_lone_erf_is_a_table_and_a_data_where_is_a_named_island():
    """Other exporters leave Erf outside a GELU pattern (an exact table lookup of its 8-bit input), or select
    with a Where whose condition is computed from activations (a float island, named)."""
    from tests.graphs import G, run

    g = G()
    x = g.qdq(g.input("x", [2, 8]), 0.02)
    e = g.qdq(g.node("Erf", [x]), 1 / 128)
    keep = g.node("Greater", [x, g.const(0.0)])
    g.output(g.qdq(g.node("Where", [keep, e, g.const(-1.0)]), 1 / 64))
    fq = g.model()
    with pytest.raises(ConversionError, match="Where"):
        rewrite(fq)
    model, report = rewrite(fq, allow_float=True)
    names = {s.split()[0] for s in report.to_dict()["float_islands"]}
    assert "Where" in names and "Erf" not in names, names
    assert report.counts["lower_integer"]["Erf → table lookup (Gather)"] == 1
    feeds = {"x": np.linspace(-0.5, 0.5, 16, dtype=np.float32).reshape(2, 8)}
    np.testing.assert_allclose(run(model, feeds)[0], run(fq, feeds)[0], atol=1 / 64 + 1e-6)
