"""fuse_softmax: decomposed softmax (with or without the max subtraction) becomes one Softmax; a sum that
is not over the last axis is declined with that reason."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import Pipeline
from tests.graphs import G, op_counts, run
from tests.passes._rules import fusion_declines

X = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)


def _softmax_graph(max_sub=True, sum_axis=-1):
    g = G(opset=13)
    x = g.qdq(g.input("x", [2, 5, 8]), 0.05)
    e = g.node("Exp", [g.node("Sub", [x, g.node("ReduceMax", [x], axes=[-1])]) if max_sub else x])
    s = g.node("ReduceSum", [e, g.const([sum_axis], np.int64)])
    g.output(g.qdq(g.node("Div", [e, s]), 1 / 256, 0, np.uint8))
    return g.model()


@pytest.mark.parametrize("max_sub", [True, False])
def test_decomposed_softmax_fuses(max_sub):
    model = _softmax_graph(max_sub)
    fused, report = Pipeline.default().run(model, stop_after="fuse_softmax")
    assert op_counts(fused).get("Softmax") == 1 and "Exp" not in op_counts(fused)
    assert report.counts["fuse_softmax"] == {"Softmax (decomposed)": 1}
    np.testing.assert_allclose(run(fused, {"x": X})[0], run(model, {"x": X})[0], atol=1 / 256 + 1e-6)


def test_sum_over_another_axis_is_declined():
    fusion_declines(_softmax_graph(sum_axis=1), "fuse_softmax", "ReduceSum not over the last axis")
