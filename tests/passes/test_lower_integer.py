"""lower_integer on tiny graphs: op counts, element types per node, numbers vs the fake-quant graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from ivit_onnx import ConversionError, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import G, op_counts, run
from tests.passes._rules import declines

RNG = np.random.default_rng(1)
X = RNG.standard_normal((2, 6, 16)).astype(np.float32)


def _attention_like():
    """QDQ input → MatMul (per-channel weight) + bias → Q/DQ → scale Mul → Softmax → Q/DQ (uint8 1/256)."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    w = RNG.standard_normal((16, 12)).astype(np.float32) * 0.3
    y = g.node("Add", [g.node("MatMul", [x, g.weight(w, axis=1)]), g.const(RNG.standard_normal(12) * 0.1)])
    y = g.node("Mul", [g.qdq(y, 0.04), g.const(0.5)])
    g.output(g.qdq(g.node("Softmax", [y], axis=-1), 1 / 256, 0, np.uint8))
    return g.model()


def test_linear_and_softmax_lower_to_integer_ops():
    fq = _attention_like()
    out, report = rewrite(fq)
    counts = op_counts(out)
    assert counts["MatMulInteger"] == 1 and counts["ai.ivit:Shiftmax"] == 1
    assert "MatMul" not in counts and "Softmax" not in counts and "Mul" not in counts
    assert float_offenders(out) == []
    # per node: the matmul is int8 x int8 -> int32
    types = {
        v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(out).graph.value_info
    }
    mm = next(n for n in out.graph.node if n.op_type == "MatMulInteger")
    assert types[mm.output[0]] == TensorProto.INT32
    a, b = run(fq, {"x": X})[0], run(out, {"x": X})[0]
    assert np.max(np.abs(a - b)) <= 4 / 256  # a few output LSB: Shiftmax's approximation
    assert report.notes["integer_mac_percent"] == 100.0


def test_gemm_conv_layernorm_gelu_chain():
    g = G(opset=20)
    x = g.qdq(g.input("img", [2, 3, 8, 8]), 0.02)
    w = RNG.standard_normal((16, 3, 4, 4)).astype(np.float32) * 0.2
    y = g.node(
        "Conv",
        [x, g.weight(w, axis=0), g.const(RNG.standard_normal(16) * 0.1)],
        kernel_shape=[4, 4],
        strides=[4, 4],
    )
    y = g.qdq(y, 0.05)
    y = g.node("Transpose", [g.node("Reshape", [y, g.const([2, 16, 4], np.int64)])], perm=[0, 2, 1])
    y = g.qdq(
        g.node(
            "LayerNormalization",
            [y, g.const(np.linspace(0.5, 1.5, 16)), g.const(np.full(16, 0.1))],
            axis=-1,
            epsilon=1e-6,
        ),
        0.03,
    )
    y = g.qdq(g.node("Gelu", [y]), 0.02)
    y = g.node("Reshape", [y, g.const([2, 64], np.int64)])
    wg = RNG.standard_normal((10, 64)).astype(np.float32) * 0.1
    g.output(g.qdq(g.node("Gemm", [y, g.weight(wg, axis=0), g.const(np.zeros(10))], transB=1), 0.05))
    fq = g.model()
    out, _ = rewrite(fq)
    counts = op_counts(out)
    for op in ("ConvInteger", "MatMulInteger", "ai.ivit:ILayerNorm", "ai.ivit:ShiftGELU"):
        assert counts.get(op) == 1, (op, counts)
    assert float_offenders(out) == []
    feed = {"img": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    a, b = run(fq, feed)[0], run(out, feed)[0]
    cos = float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))
    assert cos > 0.99


def test_int8_graph_input():
    g = G()
    x = g.input("xq", [2, 6, 16], TensorProto.INT8)
    s, z = g.const(0.03), g.const(0, np.int8)
    xf = g.node("DequantizeLinear", [x, s, z])
    y = g.node("MatMul", [xf, g.weight(RNG.standard_normal((16, 4)), axis=1)])
    g.output(g.qdq(y, 0.05))
    fq = g.model()
    out, _ = rewrite(fq)
    xq = RNG.integers(-128, 128, (2, 6, 16)).astype(np.int8)
    assert op_counts(out).get("MatMulInteger") == 1
    np.testing.assert_allclose(run(out, {"xq": xq})[0], run(fq, {"xq": xq})[0], atol=0.05 + 1e-6)


def _island():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    g.output(g.qdq(g.node("Hardmax", [x]), 0.01))
    return g.model()


def test_float_island_strict_names_the_node():
    with pytest.raises(ConversionError, match=r"Hardmax '.*'.*--allow-float"):
        rewrite(_island())


def test_node_without_a_rule_is_declined_with_the_reason():
    declines(_island(), "Hardmax", "no integer rule for Hardmax")


def test_float_island_allowed_is_reported_and_runs():
    fq = _island()
    out, report = rewrite(fq, allow_float=True)
    assert len(report.notes["float_islands"]) == 1 and "Hardmax" in report.notes["float_islands"][0]
    assert any("Hardmax" in o.node for o in float_offenders(out))
    np.testing.assert_allclose(run(out, {"x": X})[0], run(fq, {"x": X})[0], atol=1e-6)


@pytest.mark.parametrize("opset", [17, 19])
def test_float16_island_stays_float16(opset):
    """ModelOpt's default leaves the head float16 (``Cast`` to float16 → MatMul with float16 weights →
    ``Cast`` back): with allow_float the island reads a float16 dequantized tensor (a float32 one failed the
    ONNX check). DequantizeLinear writes float16 itself from opset 19, through a Cast before."""
    g = G(opset)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    w = g.const(RNG.standard_normal((16, 4)).astype(np.float16), np.float16)
    y = g.node("MatMul", [g.node("Cast", [x], to=TensorProto.FLOAT16), w])
    g.output(g.node("Cast", [y], to=TensorProto.FLOAT))
    fq = g.model()
    with pytest.raises(ConversionError, match=r"MatMul '.*'"):
        rewrite(fq)
    out, report = rewrite(fq, allow_float=True)
    assert len(report.notes["float_islands"]) == 1
    np.testing.assert_allclose(run(out, {"x": X})[0], run(fq, {"x": X})[0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "scale, msg",
    [
        (0.0, "must be positive"),
        (-0.1, "must be positive"),
        (float("nan"), "not finite"),
        (float("inf"), "not finite"),
    ],
)
def test_bad_scales_are_one_line_errors_naming_the_node(scale, msg):
    g = G()
    g.output(g.qdq(g.input("x", [2, 6, 16]), scale))
    with pytest.raises(ConversionError, match=msg) as e:
        rewrite(g.model())
    assert "QuantizeLinear" in str(e.value) and "\n" not in str(e.value)


def test_output_is_deterministic():
    fq = _attention_like()
    a, _ = rewrite(fq)
    b, _ = rewrite(fq)
    assert a.SerializeToString() == b.SerializeToString()


def test_unsupported_quantized_type_is_named():
    g = G()
    g.output(g.qdq(g.input("x", [2, 6, 16]), 0.1, 0, np.int32))
    with pytest.raises(ConversionError, match=r"QuantizeLinear .*unsupported quantized type int32"):
        rewrite(g.model())


def test_float_convtranspose_counts_in_the_mac_share():
    """A ConvTranspose left float (a dense-prediction decoder whose weight the quantizer left float) is in the
    report's MAC total: the integer share is not 100 %."""

    rng = np.random.default_rng(0)
    g = G()
    x = g.qdq(g.input("x", [1, 4, 6, 6]), 0.05)
    y = g.qdq(g.node("Conv", [x, g.weight(rng.standard_normal((8, 4, 1, 1)), axis=0)]), 0.1)
    w = g.const(rng.standard_normal((8, 2, 2, 2)))  # float: the ConvTranspose rule declines
    g.output(g.qdq(g.node("ConvTranspose", [y, w], strides=[2, 2]), 0.1))
    _, report = rewrite(g.model(), allow_float=True)
    conv, deconv = 8 * 4 * 36, 8 * 36 * 2 * 2 * 2  # N*Cout*H*W*K; N*Cin*H*W * Cout/g*kh*kw
    assert report.notes["total_macs"] == conv + deconv
    assert report.notes["integer_mac_percent"] == pytest.approx(100 * conv / (conv + deconv))
