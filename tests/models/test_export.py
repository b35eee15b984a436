"""ONNX export with both torch exporters: QDQ structure, onnxruntime vs torch, dynamic batch, int16."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from ivit_onnx.models.export import export_onnx  # noqa: E402
from ivit_onnx.models.quant import quantize  # noqa: E402
from ivit_onnx.models.runtime import cosine, run_onnx  # noqa: E402
from ivit_onnx.models.vit import vit  # noqa: E402

from .conftest import TINY, fan_in_init, images, zero_point_types  # noqa: E402

EXPORTERS = ["torchscript", "dynamo"]


def op_counts(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_fp32_export(exports, tiny_vit, x, exporter):
    model = onnx.load(exports[exporter, "fp32"])
    assert model.ir_version <= 10
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]
    counts = op_counts(model)
    assert "QuantizeLinear" not in counts
    assert counts["LayerNormalization"] == 2 * TINY["depth"] + 1 and counts["Softmax"] == TINY["depth"]
    with torch.no_grad():
        np.testing.assert_allclose(run_onnx(model, x.numpy()), tiny_vit(x).numpy(), atol=1e-4)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_fake_quant_export_matches_torch(exports, tiny_fq, exporter):
    model = onnx.load(exports[exporter, "fq"])
    onnx.checker.check_model(model, full_check=True)
    counts = op_counts(model)
    assert counts["QuantizeLinear"] == counts["DequantizeLinear"] > 0
    # per block: 6 Linear/Conv weights and 14 activations; outside: 1 conv weight, head, 7 activations
    assert counts["QuantizeLinear"] == TINY["depth"] * (4 + 12) + 1 + 1 + 7
    assert zero_point_types(model) == {"INT8", "UINT8"}
    for batch in (1, 3):  # dynamic batch
        x = images(batch, 10 + batch)
        with torch.no_grad():
            expected = tiny_fq(x).numpy()
        got = run_onnx(model, x.numpy())
        assert got.shape == (batch, 10)
        # float rounding differences can flip a rounding step somewhere and propagate a few LSBs
        assert cosine(got, expected) > 0.99


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_int16_residual_export_uses_opset_21(tmp_path, tiny_vit, calib, x, exporter):
    fq = quantize(tiny_vit, calib, residual_bits=16)
    model = export_onnx(fq, x, tmp_path / "int16.onnx", exporter=exporter)
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {21}
    assert zero_point_types(model) == {"INT8", "UINT8", "INT16"}
    assert "Erf" in op_counts(model)  # the GELU form of opset 17 is kept
    with torch.no_grad():
        assert cosine(run_onnx(model, x.numpy()), fq(x).numpy()) > 0.99


def test_opset_21_tanh_gelu(tmp_path, calib, x):
    model = fan_in_init(vit(**TINY, gelu="tanh"))
    fq = quantize(model, calib)
    exported = export_onnx(fq, x, tmp_path / "tanh.onnx", opset=21)
    gelus = [n for n in exported.graph.node if n.op_type == "Gelu"]
    assert len(gelus) == TINY["depth"]
    assert all(a.s == b"tanh" for n in gelus for a in n.attribute if a.name == "approximate")
    with torch.no_grad():
        assert cosine(run_onnx(exported, x.numpy()), fq(x).numpy()) > 0.99


def test_distilled_export(tmp_path, calib, x):
    model = fan_in_init(vit(**TINY, distilled=True))
    fq = quantize(model, calib)
    exported = export_onnx(fq, x, tmp_path / "distilled.onnx")
    assert op_counts(exported)["Gemm"] == 2
    with torch.no_grad():
        assert cosine(run_onnx(exported, x.numpy()), fq(x).numpy()) > 0.99


def test_unknown_exporter(tmp_path, tiny_vit, x):
    with pytest.raises(ValueError, match="exporter"):
        export_onnx(tiny_vit, x, tmp_path / "m.onnx", exporter="tf2onnx")
