"""Rules for QuantizeLinear / DequantizeLinear / QCDQ Clip (passes/rules/qdq.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from ivit_onnx import ConversionError, rewrite
from tests.graphs import G, op_counts
from tests.passes._rules import RNG, X, lowered


def test_requantize_between_two_types_within_one_step():
    g = G()
    g.output(g.qdq(g.qdq(g.input("x", [2, 6, 16]), 0.03), 0.07))
    out, report = lowered(g.model(), {"x": X}, 0.07 + 1e-6)
    assert report.counts["lower_integer"]["QuantizeLinear→Requantize"] == 1
    assert op_counts(out).get("ai.ivit:Requantize") == 1


def test_same_type_quantize_is_folded_exactly():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    g.output(g.qdq(g.node("Reshape", [x, g.const([2, 96], np.int64)]), 0.03))
    out, report = lowered(g.model(), {"x": X}, 1e-6)
    assert report.counts["lower_integer"][
        "QuantizeLinear folded"
    ] == 1 and "ai.ivit:Requantize" not in op_counts(out)


def test_int8_graph_input_is_dequantized_by_its_own_type():
    g = G()
    x = g.input("xq", [2, 6, 16], TensorProto.INT8)
    y = g.node("DequantizeLinear", [x, g.const(0.03), g.const(3, np.int8)])
    g.output(g.qdq(g.node("Transpose", [y], perm=[0, 2, 1]), 0.03, 3))
    lowered(g.model(), {"xq": RNG.integers(-128, 128, (2, 6, 16)).astype(np.int8)}, 1e-6)


def test_qcdq_clip_clips_the_integers_exactly():
    g = G()
    x = g.input("x", [2, 6, 16])
    s, z = g.const(0.01), g.const(0, np.int8)
    y = g.qdq(g.node("Mul", [x, g.const(0.5)]), 0.02)  # a lowered value, so the next Q has a type
    q = g.node("Clip", [g.node("QuantizeLinear", [y, s, z]), g.const(-100, np.int8), g.const(100, np.int8)])
    g.output(g.node("DequantizeLinear", [q, s, z]))
    out, report = lowered(g.model(), {"x": X}, 0.01 + 1e-6, allow_float=True)
    assert report.counts["lower_integer"]["QCDQ Clip (narrow range)"] == 1


def test_float_clip_is_left_to_the_unary_rule():
    """Not QCDQ: the float Clip is the unary rule's (tests/passes/test_rule_unary.py), exact into another
    scale."""
    g = G()
    g.output(g.qdq(g.node("Clip", [g.qdq(g.input("x", [2, 6, 16]), 0.03), g.const(0.0), g.const(0.5)]), 0.01))
    _, report = lowered(g.model(), {"x": X}, atol=0)
    assert "QCDQ Clip (narrow range)" not in report.counts["lower_integer"]
    assert report.counts["lower_integer"]["Clip → table lookup (Gather)"] == 1


def test_non_constant_clip_bounds_are_an_error():
    g = G()
    x = g.input("x", [2, 6, 16])
    lo = g.input("lo", [], TensorProto.INT8)
    s, z = g.const(0.01), g.const(0, np.int8)
    y = g.qdq(g.node("Mul", [x, g.const(0.5)]), 0.02)
    g.output(g.node("DequantizeLinear", [g.node("Clip", [g.node("QuantizeLinear", [y, s, z]), lo]), s, z]))
    with pytest.raises(
        ConversionError, match=r"Clip '.*': the bounds of an integer Clip are not integer constants"
    ):
        rewrite(g.model(), allow_float=True)


@pytest.mark.parametrize(
    "op, what",
    [("QuantizeLinear", "zero points on activations"), ("DequantizeLinear", "non-zero zero points")],
)
def test_per_channel_zero_points_are_refused(op, what):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    zp, s = np.arange(16, dtype=np.int8), g.const(np.full(16, 0.03))
    if op == "QuantizeLinear":  # of a lowered value: its type is read
        y = g.node(
            "DequantizeLinear",
            [g.node("QuantizeLinear", [x, s, g.const(zp, np.int8)], axis=2), s, g.const(zp, np.int8)],
            axis=2,
        )
    else:
        y = g.node(
            "DequantizeLinear",
            [g.node("QuantizeLinear", [x, g.const(0.03), g.const(0, np.int8)]), s, g.const(zp, np.int8)],
            axis=2,
        )
    g.output(g.qdq(g.node("Mul", [y, g.const(0.5)]), 0.02))
    with pytest.raises(ConversionError, match=rf"{op} '.*': per-channel {what} are not supported"):
        rewrite(g.model())
