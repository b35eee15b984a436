"""Pad rule (passes/rules/pad.py): the same Pad on the integers, the pad value moved to its grid point, pads
computed from constants folded to one; every reason to decline."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import X, declines, lowered

PADS = [0, 1, 0, 0, 2, 0]


@pytest.mark.parametrize("value, zp", [(None, 4), (0.0, 4), (0.06, -3)])
def test_pad_is_exact_with_the_value_on_the_grid(value, zp):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, zp)
    extra = [] if value is None else [g.const(value)]
    g.output(g.qdq(g.node("Pad", [x, g.const(PADS, np.int64), *extra]), 0.03, zp))
    out, report = lowered(g.model(), {"x": X}, 1e-6)
    assert op_counts(out).get("Pad") == 1 and report.counts["lower_integer"]["Pad (zero point)"] == 1


def test_int16_input_is_padded_in_int32():
    """onnxruntime has no int16 Pad (NNCF leaves Swin's LayerNorm float: its int16 output is padded)."""
    g = G(opset=21)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.001, 0, np.int16)
    g.output(g.qdq(g.node("Pad", [x, g.const(PADS, np.int64)]), 0.001, 0, np.int16))
    out, _ = lowered(g.model(), {"x": X}, 1e-6)
    pad = next(n for n in out.graph.node if n.op_type == "Pad")
    cast = next(n for n in out.graph.node if pad.input[0] in n.output)
    assert cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.INT32


def test_pads_computed_from_constants_become_one_constant():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    pads = g.node("Concat", [g.const(PADS[:3], np.int64), g.const(PADS[3:], np.int64)], axis=0)
    g.output(g.qdq(g.node("Pad", [x, pads]), 0.03))
    out, _ = lowered(g.model(), {"x": X}, 1e-6)
    pad = next(n for n in out.graph.node if n.op_type == "Pad")
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in out.graph.initializer}
    assert "Concat" not in op_counts(out) and inits[pad.input[1]].tolist() == PADS


def _decline_graph(case):
    g = G()
    x = g.input("x", [2, 6, 16])
    x = x if case == "float" else g.qdq(x, 0.03)
    value = {"scalar": [g.input("v", [])], "grid": [g.const(0.5)]}.get(case, [])
    attrs = {"mode": "reflect"} if case == "mode" else {}
    g.output(g.qdq(g.node("Pad", [x, g.const(PADS, np.int64), *value], **attrs), 0.03))
    return g.model()


@pytest.mark.parametrize(
    "case, reason",
    [
        ("float", "input is not quantized"),
        ("mode", "mode 'reflect' (only constant padding)"),
        ("scalar", "pad value not a scalar constant"),
        ("grid", "pad value 0.5 is not on the integer grid"),
    ],
)
def test_declines_with_the_reason(case, reason):
    declines(_decline_graph(case), "Pad", reason)
