"""fuse_layernorm: decomposed LayerNorm (Pow or Mul square, Div or Reciprocal, optional gamma/beta) becomes
LayerNormalization with the same values; each reason to decline is reported."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import Pipeline
from tests.graphs import G, op_counts, run
from tests.passes._rules import fusion_declines

X = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)


def _layernorm_graph(square="pow", divide="div", affine=True, mean_axis=-1, eps=1e-5, last="8"):
    g = G(opset=17)
    x = g.qdq(g.input("x", [2, 5, 8 if last == "8" else last]), 0.05)
    mean = g.node("ReduceMean", [x], axes=[mean_axis])
    d = g.node("Sub", [x, mean])
    sq = g.node("Pow", [d, g.const(2.0)]) if square == "pow" else g.node("Mul", [d, d])
    var = g.node("ReduceMean", [sq], axes=[-1])
    std = g.node("Sqrt", [g.node("Add", [var, g.const(eps)])])
    y = g.node("Div", [d, std]) if divide == "div" else g.node("Mul", [d, g.node("Reciprocal", [std])])
    if affine:
        gamma = np.linspace(0.5, 1.5, 8).astype(np.float32)
        y = g.node("Add", [g.node("Mul", [y, g.const(gamma)]), g.const(np.full(8, 0.1, np.float32))])
    g.output(g.qdq(y, 0.05))
    return g.model()


@pytest.mark.parametrize(
    "square, divide, affine", [("pow", "div", True), ("mul", "div", True), ("mul", "rcp", False)]
)
def test_decomposed_layernorm_fuses(square, divide, affine):
    model = _layernorm_graph(square, divide, affine)
    fused, report = Pipeline.default().run(model, stop_after="fuse_layernorm")
    counts = op_counts(fused)
    assert counts.get("LayerNormalization") == 1 and "Sqrt" not in counts and "ReduceMean" not in counts
    assert report.counts["fuse_layernorm"] == {"LayerNorm (decomposed)": 1}
    np.testing.assert_allclose(run(fused, {"x": X})[0], run(model, {"x": X})[0], atol=0.05 + 1e-6)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"mean_axis": 1}, "ReduceMean not over the last axis"),
        ({"eps": np.full(8, 1e-5)}, "epsilon is not a scalar"),
        ({"last": "c", "affine": False}, "the channel count is unknown"),
    ],
)
def test_declines_with_the_reason(kwargs, reason):
    fusion_declines(_layernorm_graph(**kwargs), "fuse_layernorm", reason)
