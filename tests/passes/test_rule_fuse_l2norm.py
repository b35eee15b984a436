"""fuse_l2norm + the L2Norm lowering rule: ``F.normalize`` from both torch exporters (and hand-written forms)
becomes one IL2Norm; the integer graph is certificate clean and agrees with the fake-quant graph.

Bounds: the normalized output is written straight into the following QuantizeLinear's type; IL2Norm's error
against float is at most ``s_y/2 + 1/r + 2**-29`` (tests/opset/test_il2norm.py) with ``1/r <= 2**-16`` here
(``shift_in = 16`` for int8), while the fake-quant graph rounds the same value once: they differ by at most
one output step, where a value lies within ``1/r`` of a rounding boundary. The cosine-attention graph's scores
go through one more Requantize and a rescale by ``logit_scale`` (each at most one step of its own type).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

import ivit_onnx
from ivit_onnx import Pipeline
from ivit_onnx.engines.onnxruntime.compile import compile_model
from tests.graphs import G, op_counts, run
from tests.passes._rules import RNG, declines, fusion_declines, lowered

torch = pytest.importorskip("torch")
F = torch.nn.functional
quant = pytest.importorskip("ivit_onnx.models.quant")
export = pytest.importorskip("ivit_onnx.models.export")

S_OUT = 1 / 128


class Normalize(torch.nn.Module):
    """``q(F.normalize(q(x), dim=-1))``."""

    def __init__(self, in_dtype=torch.int8):
        super().__init__()
        self.qi, self.qo = quant.ActFakeQuant(in_dtype, 0.05), quant.ActFakeQuant(torch.int8, S_OUT)
        if in_dtype == torch.uint8:
            self.qi.zero_point.fill_(128)

    def forward(self, x):
        return self.qo(F.normalize(self.qi(x), dim=-1))


class CosineAttention(torch.nn.Module):
    """Swinv2's cosine scores: ``normalize(q) @ normalize(k)^T * logit_scale``, each tensor quantized."""

    def __init__(self):
        super().__init__()
        q = quant.ActFakeQuant
        self.qi, self.qq, self.qk = q(torch.int8, 0.05), q(torch.int8, S_OUT), q(torch.int8, S_OUT)
        self.qs, self.qo = q(torch.int8, 1 / 64), q(torch.int8, 0.1)

    def forward(self, x):
        x = self.qi(x)
        q = self.qq(F.normalize(x[..., :16], dim=-1))
        k = self.qk(F.normalize(x[..., 16:], dim=-1))
        return self.qo(self.qs(q @ k.transpose(-2, -1)) * 10.0)


def exported(module, x, exporter):
    with tempfile.TemporaryDirectory() as tmp:
        return export.export_onnx(module, x, Path(tmp) / "m.onnx", exporter)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("in_dtype", [torch.int8, torch.uint8])
def test_exported_normalize_becomes_il2norm(exporter, in_dtype):
    x = RNG.standard_normal((2, 6, 16)).astype(np.float32)
    x[0, 0] = 0.0  # an all-zero row: 0 in both graphs
    fq = exported(Normalize(in_dtype), torch.from_numpy(x), exporter)
    assert {"ReduceL2", "Clip", "Div"} <= set(op_counts(fq))
    out, report = lowered(fq, {"input": x}, atol=S_OUT + 1e-6)
    assert report.counts["fuse_l2norm"] == {"L2 normalization (F.normalize)": 1}
    counts = op_counts(out)
    assert counts.get("ai.ivit:IL2Norm") == 1 and "ReduceL2" not in counts and "Div" not in counts
    assert np.all(run(out, {"input": x})[0][0, 0] == 0)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_cosine_attention_converts(exporter, tmp_path):
    x = RNG.standard_normal((2, 6, 32)).astype(np.float32)
    fq = exported(CosineAttention(), torch.from_numpy(x), exporter)
    # scores within one 1/64 step, times 10, plus the output's own step
    out, _ = lowered(fq, {"input": x}, atol=10 / 64 + 0.1 + 1e-6)
    assert op_counts(out).get("ai.ivit:IL2Norm") == 2
    # the onnxruntime engine re-encodes both IL2Norm outputs as uint8 for q @ k^T: the same bits
    assert compile_model(out).counts["u8_gemm"] == 2
    ivit_onnx.save_model(out, str(tmp_path / "int.onnx"))
    got = ivit_onnx.InferenceSession(str(tmp_path / "int.onnx"), threads=1).run(None, {"input": x})[0]
    np.testing.assert_array_equal(got, run(out, {"input": x})[0])


class EmbeddingOutput(torch.nn.Module):
    """A sentence embedding's last step (#28): ``F.normalize`` with no QuantizeLinear after it."""

    def __init__(self):
        super().__init__()
        self.qi = quant.ActFakeQuant(torch.int8, 0.05)

    def forward(self, x):
        return F.normalize(self.qi(x), dim=-1)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_unquantized_output_is_int16_at_2_to_the_minus_15(exporter):
    """No QuantizeLinear follows: IL2Norm writes int16 at ``2**-15``, within ``2**-16 + 1/r + 2**-29`` of
    float (``1/r <= 2**-16`` for int8 rows), dequantized at the output."""
    x = RNG.standard_normal((2, 6, 16)).astype(np.float32)
    fq = exported(EmbeddingOutput(), torch.from_numpy(x), exporter)
    out, _ = lowered(fq, {"input": x}, atol=2.0**-15 + 1e-7)
    assert op_counts(out).get("ai.ivit:IL2Norm") == 1


def _hand_written(square="pow", clamp="max", divide="div", eps=1e-12, axis=-1, scale=0.05):
    """``x / max(sqrt(sum(x**2)), eps)`` in other forms: Pow or Mul square, Max or no clamp, Reciprocal."""
    g = G(opset=17)
    x = g.qdq(g.input("x", [2, 6, 16]), scale)
    sq = g.node("Pow", [x, g.const(2.0)]) if square == "pow" else g.node("Mul", [x, x])
    norm = g.node("Sqrt", [g.node("ReduceSum", [sq, g.const(np.array([axis], np.int64), np.int64)])])
    den = g.node("Max", [norm, g.const(eps)]) if clamp == "max" else norm
    y = g.node("Div", [x, den]) if divide == "div" else g.node("Mul", [x, g.node("Reciprocal", [den])])
    g.output(g.qdq(y, S_OUT))
    return g.model()


@pytest.mark.parametrize("square, clamp, divide", [("pow", "max", "div"), ("mul", "none", "rcp")])
def test_hand_written_forms(square, clamp, divide):
    x = RNG.standard_normal((2, 6, 16)).astype(np.float32)
    fq = _hand_written(square, clamp, divide)
    fused, report = Pipeline.default().run(fq, stop_after="fuse_l2norm")
    assert op_counts(fused).get("LpNormalization") == 1 and "Sqrt" not in op_counts(fused)
    np.testing.assert_allclose(run(fused, {"x": x})[0], run(fq, {"x": x})[0], atol=S_OUT + 1e-6)
    out, _ = lowered(fq, {"x": x}, atol=S_OUT + 1e-6)
    assert op_counts(out).get("ai.ivit:IL2Norm") == 1


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"axis": 1}, "ReduceSum not over the last axis with keepdims"),
        ({"eps": 0.1}, "epsilon 0.1 exceeds the input's quantization step 0.05"),
    ],
)
def test_declines_with_the_reason(kwargs, reason):
    fusion_declines(_hand_written(**kwargs), "fuse_l2norm", reason)


def test_wide_accumulator_is_made_per_tensor_and_narrowed_first():
    """A MatMul's per-channel int32 accumulator read directly (channel scales 1e-4..1, no clamp so no step to
    check): per tensor at its finest scale, whose bound leaves no room for an exact sum of squares, so a
    power-of-two Requantize narrows it before IL2Norm (``qparams.l2norm``'s ``pre``); on these rows (norms far
    above the narrowing step) within one output step."""
    rng = np.random.default_rng(0)
    g = G(opset=17)
    x = g.qdq(g.input("x", [2, 6, 64]), 0.05)
    w = rng.standard_normal((64, 16)).astype(np.float32) * np.logspace(-4, 0, 16).astype(np.float32)
    y = g.node("MatMul", [x, g.weight(w, axis=1)])
    sq = g.node("ReduceSum", [g.node("Mul", [y, y]), g.const(np.array([-1], np.int64), np.int64)])
    g.output(g.qdq(g.node("Div", [y, g.node("Sqrt", [sq])]), S_OUT))
    xs = rng.standard_normal((2, 6, 64)).astype(np.float32)
    out, _ = lowered(g.model(), {"x": xs}, atol=S_OUT + 1e-6)
    counts = op_counts(out)
    assert counts.get("ai.ivit:IL2Norm") == 1 and counts.get("ai.ivit:Requantize") == 2  # per tensor, narrow


def _lp_normalization(p=2, axis=-1):
    g = G(opset=17)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05, zp=3)
    g.output(g.qdq(g.node("LpNormalization", [x], axis=axis, p=p), S_OUT))
    return g.model()


def test_standard_lp_normalization_lowers():
    """ONNX's own LpNormalization (p=2, last axis; a zero point on the input) lowers without a fusion."""
    x = RNG.standard_normal((2, 6, 16)).astype(np.float32)
    out, _ = lowered(_lp_normalization(), {"x": x}, atol=S_OUT + 1e-6)
    assert op_counts(out).get("ai.ivit:IL2Norm") == 1


@pytest.mark.parametrize("kwargs, reason", [({"p": 1}, "p=1: only the L2 norm has an integer kernel"),
                                            ({"axis": 1}, "not over the last axis")])
def test_lowering_declines_with_the_reason(kwargs, reason):
    declines(_lp_normalization(**kwargs), "LpNormalization", reason)
