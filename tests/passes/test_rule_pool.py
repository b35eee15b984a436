"""ReduceMean / GlobalAveragePool rule (passes/rules/pool.py): an int32 ReduceSum typed ``s/N``, one rounding
at the next QuantizeLinear, and every reason to decline."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.graphs import G, op_counts
from tests.passes._rules import X, declines, lowered


@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([1, 2], 0)])
def test_reducemean_is_an_int32_sum_within_one_output_step(axes, keepdims):
    g = G(opset=18)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 4)
    g.output(g.qdq(g.node("ReduceMean", [x, g.const(axes, np.int64)], keepdims=keepdims), 0.01))
    out, report = lowered(g.model(), {"x": X}, 0.01 + 1e-6)
    assert op_counts(out).get("ReduceSum") == 1 and "ReduceMean" not in op_counts(out)
    assert report.counts["lower_integer"]["ReduceMean → ReduceSum (int32)"] == 1


def test_global_average_pool_over_the_tokens():
    """Hugging Face Swin's pooler, ``AdaptiveAvgPool1d(1)`` on ``[B, C, L]``, exports as GlobalAveragePool."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 4)
    g.output(g.qdq(g.node("GlobalAveragePool", [x]), 0.01))
    out, report = lowered(g.model(), {"x": X}, 0.01 + 1e-6)
    assert op_counts(out).get("ReduceSum") == 1 and "GlobalAveragePool" not in op_counts(out)
    assert report.counts["lower_integer"]["GlobalAveragePool → ReduceSum (int32)"] == 1


def _decline_graph(case):
    g = G(opset=21)
    shape = {"dynamic": [2, "n", 16], "overflow": [1, 2100, 64]}.get(case, [2, 6, 16])
    x = g.input("x", shape)
    x = x if case == "float" else g.qdq(x, 0.03)
    if case == "overflow":  # an int32 accumulator (|x| <= 64 * 127 * 127) summed over 2100 rows
        x = g.node("MatMul", [x, g.weight(np.ones((64, 64)), axis=1)])
    axes = g.input("axes", [1], TensorProto.INT64) if case == "axes" else g.const([1], np.int64)
    g.output(g.node("Reshape", [g.qdq(g.node("ReduceMean", [x, axes]), 0.01), g.const([-1], np.int64)]))
    return g.model()


@pytest.mark.parametrize(
    "case, reason",
    [
        ("float", "input is not quantized"),
        ("axes", "axes or input rank not known at conversion time"),
        ("dynamic", "reduced dims ['n'] unknown (not static)"),
        ("overflow", "could overflow int32"),
    ],
)
def test_declines_with_the_reason(case, reason):
    declines(_decline_graph(case), "ReduceMean", reason)


@pytest.mark.parametrize(
    "zp, dtype, attrs",
    [
        (0, np.int8, {"kernel_shape": [2, 2], "strides": [2, 2]}),
        (7, np.uint8, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ],
)
def test_average_pool_is_a_window_sum_within_one_output_step(zp, dtype, attrs):
    """Window sums of the centred integers (a depthwise ConvInteger of ones; it pads with the zero point, a
    real zero), typed ``s/N``: one rounding at the QuantizeLinear."""
    g = G()
    x = g.qdq(g.input("img", [1, 2, 6, 6]), 0.03, zp, dtype)
    g.output(g.qdq(g.node("AveragePool", [x], **attrs), 0.01, zp, dtype))
    img = np.random.default_rng(3).standard_normal((1, 2, 6, 6)).astype(np.float32)
    out, report = lowered(g.model(), {"img": img}, 0.01 + 1e-6)
    assert op_counts(out).get("ConvInteger") == 1 and "AveragePool" not in op_counts(out)
    assert report.counts["lower_integer"]["AveragePool → ConvInteger window sums (int32)"] == 1


def test_average_pool_declines_edge_windows_of_fewer_elements():
    g = G()
    x = g.qdq(g.input("img", [1, 2, 6, 6]), 0.03)
    g.output(g.qdq(g.node("AveragePool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 0.01))
    declines(g.model(), "AveragePool", "count_include_pad=0")
