"""Resize rule (passes/rules/resize.py): nearest on the integers (exact), linear/cubic with rational weights
(a common denominator ``D``) as int32 MatMuls typed ``s/D`` (within one output step: the fake-quant graph
rounds its float sums, the integer graph rounds once at the QuantizeLinear); weights with no small common
denominator and unexact scales decline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import RNG, declines, lowered

IMG = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)


def _resize(scales=(1, 1, 2, 1.5), sizes=None, zp: int = 7, out_scale: float = 0.03, batch=1, **attrs):
    g = G(opset=18)
    x = g.qdq(g.input("img", [batch, 2, 6, 6]), 0.03, zp, np.uint8)
    args = [x, "", g.const(scales)] if sizes is None else [x, "", "", g.const(sizes, np.int64)]
    g.output(g.qdq(g.node("Resize", args, **attrs), out_scale, zp, np.uint8))
    return g.model()


@pytest.mark.parametrize("given", ["scales", "sizes"])
def test_nearest_runs_on_the_integers_exactly(given):
    model = _resize(mode="nearest") if given == "scales" else _resize(sizes=[1, 2, 12, 9], mode="nearest")
    out, report = lowered(model, {"img": IMG}, 1e-6)
    assert op_counts(out).get("Resize") == 1
    assert report.counts["lower_integer"]["Resize (nearest) on the integers"] == 1


@pytest.mark.parametrize(
    "mode, scales, attrs",
    [
        ("linear", (1, 1, 2, 2), {}),
        ("linear", (1, 1, 2, 1), {"coordinate_transformation_mode": "asymmetric"}),
        ("linear", (1, 1, 0.5, 0.5), {}),
        ("cubic", (1, 1, 2, 2), {}),
        ("linear", (1, 1, 3, 3), {}),  # thirds
        ("linear", (1, 1, 2, 2), {"coordinate_transformation_mode": "align_corners"}),  # fifteenths (DPT)
        ("cubic", (1, 1, 3, 3), {}),  # cubic in thirds: 108ths
    ],
)
def test_interpolation_with_rational_weights_within_one_output_step(mode, scales, attrs):
    model = _resize(scales=scales, mode=mode, out_scale=0.02, **attrs)
    out, report = lowered(model, {"img": IMG}, 0.02 + 1e-6)
    assert "Resize" not in op_counts(out) and op_counts(out).get("MatMul", 0) >= 1
    assert report.counts["lower_integer"][f"Resize ({mode}) as int32 MatMuls"] == 1


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (
            {"scales": (1, 1, 1.2345, 1), "mode": "linear"},
            "interpolation weights along axis 2 have no common denominator <= 4096 (scale 1.2345)",
        ),
        ({"scales": (1, 2, 2, 2), "mode": "linear"}, "resizes an axis other than the last two"),
        ({"scales": (1, 1, 1.7, 1.7), "mode": "nearest"}, "are not the exact ratio of the static sizes"),
    ],
)
def test_declines_with_the_reason(kwargs, reason):
    declines(_resize(**kwargs), "Resize", reason)


def test_interpolation_keeps_a_symbolic_batch():
    """MobileViT's bilinear upsampling behind a symbolic batch: the batch axis is not resized (scale 1), so
    the last two axes' matrices are static and the rule applies."""
    model = _resize(scales=(1, 1, 2, 2), mode="linear", out_scale=0.02, batch="N")
    out, _ = lowered(model, {"img": np.concatenate([IMG, -IMG])}, 0.02 + 1e-6)
    assert "Resize" not in op_counts(out)


def test_interpolation_with_a_renamed_batch():
    """onnxruntime's symbolic shape inference (``quant_pre_process``) names a Resize's output batch anew,
    ``floor(1.0*N)``: the given scale 1 still says the batch is not resized."""
    import onnx

    model = _resize(scales=(1, 1, 2, 2), mode="linear", out_scale=0.02, batch="N")
    resize = next(n for n in model.graph.node if n.op_type == "Resize")
    renamed = ["floor(1.0*N)", 2, 12, 12]
    model.graph.value_info.append(onnx.helper.make_tensor_value_info(resize.output[0], 1, renamed))
    out, _ = lowered(model, {"img": np.concatenate([IMG, -IMG])}, 0.02 + 1e-6)
    assert "Resize" not in op_counts(out)
