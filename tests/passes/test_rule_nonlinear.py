"""Rules for Softmax / Gelu / LayerNormalization (passes/rules/nonlinear.py): Shiftmax, ShiftGELU and
ILayerNorm (IBertGELU, L1LayerNorm with --gelu ibert / --layernorm l1) against the fake-quant graph, and every
reason to decline."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import rewrite
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


def test_layernorm_with_dead_gamma_entries_converts():
    """Pretrained weights hold dead gamma entries (-5e-33, -2e-37): their multiplier is 0 (the channel is its
    bias), not a refusal; the output still matches the fake-quant graph within two steps (and the L1
    ablation kernel converts too)."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05)
    gamma = np.linspace(0.5, 1.5, 16)
    gamma[[3, 11]] = -5e-33, -2.29e-37
    beta = np.full(16, 0.1)
    node = g.node("LayerNormalization", [x, g.const(gamma), g.const(beta)], axis=-1, epsilon=1e-5)
    g.output(g.qdq(node, 0.03))
    out, _ = lowered(g.model(), {"x": X}, 2 * 0.03 + 1e-6)
    assert op_counts(out).get("ai.ivit:ILayerNorm") == 1
    out, _ = rewrite(g.model(), layernorm="l1")
    assert op_counts(out).get("ai.ivit:L1LayerNorm") == 1


def test_gelu_ibert_is_ibertgelu_within_two_output_steps():
    """``--gelu ibert``: I-BERT's polynomial GELU (within 0.0182 of the erf GELU) in place of ShiftGELU."""
    g = G(opset=20)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 3)
    g.output(g.qdq(g.node("Gelu", [x]), 0.02))
    out, _ = lowered(g.model(), {"x": X}, 2 * 0.02 + 1e-6, gelu="ibert")
    counts = op_counts(out)
    assert counts.get("ai.ivit:IBertGELU") == 1 and "ai.ivit:ShiftGELU" not in counts


def test_gelu_ibert_refuses_a_scale_too_fine_for_its_polynomial():
    """The erf's clip point must stay below 2**31 grid steps: one line naming the node, no traceback."""
    from ivit_onnx import ConversionError, rewrite

    g = G(opset=20)
    g.output(g.qdq(g.node("Gelu", [g.qdq(g.input("x", [2, 6, 16]), 1e-11, 0, np.int16)]), 0.02))
    with pytest.raises(ConversionError, match=r"Gelu '.*': GELU input scale 1e-11 too fine for the erf"):
        rewrite(g.model(), gelu="ibert")


def test_layernorm_l1_is_l1layernorm_within_two_output_steps_of_l1_layernorm():
    """``--layernorm l1``: Fully-8bit's normalization by sqrt(pi/2) mean|x - mean|, which differs from
    LayerNorm by the rows' own sigma / (sqrt(pi/2) mean|d|): compared with that formula, in float."""
    from tests.graphs import run

    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05)
    gamma, beta = np.linspace(0.5, 1.5, 16), np.full(16, 0.1)
    ln = g.node("LayerNormalization", [x, g.const(gamma), g.const(beta)], axis=-1, epsilon=1e-5)
    g.output(g.qdq(ln, 0.03))
    model = g.model()
    out, _ = lowered(model, {"x": X}, np.inf, layernorm="l1")
    counts = op_counts(out)
    assert counts.get("ai.ivit:L1LayerNorm") == 1 and "ai.ivit:ILayerNorm" not in counts
    xq = np.clip(np.round(X / 0.05), -128, 127) * 0.05
    d = xq - xq.mean(-1, keepdims=True)
    want = np.clip(d / (np.sqrt(np.pi / 2) * np.abs(d).mean(-1, keepdims=True)) * gamma + beta, -3.84, 3.81)
    assert np.max(np.abs(run(out, {"x": X})[0] - want)) <= 2 * 0.03
    assert np.max(np.abs(run(model, {"x": X})[0] - want)) > 2 * 0.03  # LayerNorm itself is not that


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
