"""Rules for Softmax / Gelu / LayerNormalization (passes/rules/nonlinear.py): Shiftmax, ShiftGELU and
ILayerNorm against the fake-quant graph, and every reason to decline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import X, declines, lowered


def test_softmax_is_shiftmax_within_a_few_output_steps():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05)
    g.output(g.qdq(g.node("Softmax", [x], axis=-1), 1 / 256, 0, np.uint8))
    out, _ = lowered(g.model(), {"x": X}, 4 / 256)
    assert op_counts(out).get("ai.ivit:Shiftmax") == 1


def test_gelu_is_shiftgelu_within_two_output_steps():
    g = G(opset=20)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 3)
    g.output(g.qdq(g.node("Gelu", [x]), 0.02))
    out, _ = lowered(g.model(), {"x": X}, 2 * 0.02 + 1e-6)
    assert op_counts(out).get("ai.ivit:ShiftGELU") == 1


def test_layernorm_is_ilayernorm_within_two_output_steps():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05)
    gamma, beta = g.const(np.linspace(0.5, 1.5, 16)), g.const(np.full(16, 0.1))
    g.output(g.qdq(g.node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5), 0.03))
    out, _ = lowered(g.model(), {"x": X}, 2 * 0.03 + 1e-6)
    assert op_counts(out).get("ai.ivit:ILayerNorm") == 1


def _decline_graph(case):
    g = G(opset=20)
    last = "c" if case == "ln_channels" else 16
    x = g.qdq(g.input("x", [2, 6, last]), 0.05)
    gamma, beta = g.const(np.linspace(0.5, 1.5, 16)), g.const(np.full(16, 0.1))
    if case == "softmax_axis":
        y = g.node("Softmax", [x], axis=1)
    elif case == "gelu_float":
        y = g.node("Gelu", [g.input("f", [2, 6, 16])])
    elif case == "ln_gamma":
        y = g.node("LayerNormalization", [x, g.input("gamma", [16]), beta], axis=-1)
    elif case == "ln_beta":
        y = g.node("LayerNormalization", [x, gamma, g.input("beta", [16])], axis=-1)
    elif case == "ln_channels":
        y = g.node("LayerNormalization", [x, gamma, beta], axis=-1)
    else:
        y = g.node("LayerNormalization", [x, g.const(np.ones((6, 16))), g.const(np.zeros((6, 16)))], axis=1)
    g.output(g.qdq(y, 0.03))
    return g.model()


@pytest.mark.parametrize(
    "case, op, reason",
    [
        ("softmax_axis", "Softmax", "not over the last axis"),
        ("gelu_float", "Gelu", "input 'f' is not quantized"),
        ("ln_gamma", "LayerNormalization", "gamma is not a constant"),
        ("ln_beta", "LayerNormalization", "beta is not a constant"),
        ("ln_channels", "LayerNormalization", "the channel count is unknown"),
        ("ln_axis", "LayerNormalization", "not over the last axis"),
    ],
)
def test_declines_with_the_reason(case, op, reason):
    declines(_decline_graph(case), op, reason)
