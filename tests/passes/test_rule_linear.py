"""Rules for MatMul / Gemm / Conv (passes/rules/linear.py): numbers against the fake-quant graph, MAC counts,
and every reason to decline."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from ivit_onnx.passes.rules.lowerer import macs
from tests.graphs import G, op_counts
from tests.passes._rules import RNG, X, declines, lowered


def _cos(a, b):
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_matmul_of_two_activations_is_matmulinteger():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    kt = g.qdq(
        g.node("Transpose", [g.node("Mul", [g.input("k", [2, 6, 16]), g.const(1.0)])], perm=[0, 2, 1]), 0.03
    )
    g.output(g.qdq(g.node("MatMul", [x, kt]), 0.1))
    out, report = lowered(g.model(), {"x": X, "k": X[::-1].copy()}, 0.1 + 1e-6, allow_float=True)
    assert op_counts(out).get("MatMulInteger") == 1 and report.notes["integer_macs"] == 2 * 6 * 6 * 16


def test_sixteen_bit_operands_are_an_exact_int32_matmul():
    g = G(opset=21)
    x = g.qdq(g.input("x", [2, 6, 16]), 1e-3, 0, np.int16)
    g.output(g.qdq(g.node("MatMul", [x, g.weight(RNG.standard_normal((16, 4)) * 0.2, axis=1)]), 0.01))
    out, report = lowered(g.model(), {"x": X}, 0.01 + 1e-6)
    assert report.counts["lower_integer"]["MatMul int32"] == 1


def test_gemm_with_transb_alpha_beta_and_bias():
    g = G()
    x = g.qdq(g.input("x", [4, 16]), 0.03)
    w = g.weight(RNG.standard_normal((8, 16)) * 0.3, axis=0)
    b = g.const(RNG.standard_normal(8) * 0.1)
    g.output(g.qdq(g.node("Gemm", [x, w, b], transB=1, alpha=0.5, beta=2.0), 0.02))
    out, report = lowered(g.model(), {"x": X[0, :4]}, 0.02 + 1e-6)
    assert (
        op_counts(out).get("MatMulInteger") == 1 and report.counts["lower_integer"]["bias Add (int32)"] == 1
    )


def test_conv_is_convinteger_with_bias():
    g = G()
    x = g.qdq(g.input("img", [1, 3, 8, 8]), 0.02, 5, np.uint8)
    w = g.weight(RNG.standard_normal((4, 3, 3, 3)) * 0.2, axis=0)
    g.output(
        g.qdq(
            g.node("Conv", [x, w, g.const(RNG.standard_normal(4) * 0.1)], kernel_shape=[3, 3], pads=[1] * 4),
            0.05,
        )
    )
    feeds = {"img": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    out, report = lowered(g.model(), feeds, 0.05 + 1e-6)
    assert op_counts(out).get("ConvInteger") == 1 and report.notes["integer_macs"] == 4 * 64 * 27


def test_float_gemm_macs_follow_transb():
    """A float island's MACs use K from the right weight axis (a transB Gemm stores W as [N, K])."""
    x, y = gs.Variable("x", np.float32, [4, 64]), gs.Variable("y", np.float32, [4, 10])
    for trans, w in ((1, np.zeros((10, 64), np.float32)), (0, np.zeros((64, 10), np.float32))):
        node = gs.Node("Gemm", inputs=[x, gs.Constant(f"w{trans}", w)], outputs=[y], attrs={"transB": trans})
        assert macs(node) == 4 * 10 * 64


def _decline_graph(case):
    g = G(opset=21)
    x = g.qdq(g.input("x", [4, 16]), 0.03)
    w = g.weight(RNG.standard_normal((16, 8)) * 0.3, axis=1)
    if case == "float_weight":
        y = g.node("MatMul", [x, g.const(RNG.standard_normal((16, 8)))])
    elif case == "unquantized":
        y = g.node("MatMul", [g.input("f", [4, 16]), w])
    elif case == "transA":
        y = g.node("Gemm", [g.qdq(g.input("t", [16, 4]), 0.03), w], transA=1)
    elif case == "activation_weight":
        y = g.node("Gemm", [x, g.qdq(g.node("Mul", [g.input("v", [16, 8]), g.const(1.0)]), 0.03)])
    elif case == "activation_bias":
        y = g.node("Gemm", [x, w, g.input("b", [8])])
    else:  # int16 input to a Conv
        img = g.qdq(g.input("img", [1, 3, 4, 4]), 1e-3, 0, np.int16)
        y = g.node("Conv", [img, g.weight(RNG.standard_normal((2, 3, 1, 1)), axis=0)], kernel_shape=[1, 1])
    g.output(g.qdq(y, 0.05))
    return g.model()


@pytest.mark.parametrize(
    "case, op, reason",
    [
        (
            "float_weight",
            "MatMul",
            "is float (no DequantizeLinear): the quantizer left this MatMul unquantized",
        ),
        ("unquantized", "MatMul", "input 'f' is not quantized"),
        ("transA", "Gemm", "transA is not supported"),
        ("activation_weight", "Gemm", "is not a constant"),
        ("activation_bias", "Gemm", "bias 'b' is not a constant"),
        ("conv16", "Conv", "operands are not 8-bit, per-tensor input and weight (int16, int8)"),
    ],
)
def test_declines_with_the_reason(case, op, reason):
    declines(_decline_graph(case), op, reason)
