"""The QDQ forms quantization toolkits emit, on tiny graphs built in code: each converts (integer-only,
numbers within an output LSB of the fake-quant graph) or stops with one line naming the node and form."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx import ConversionError, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import G, op_counts, run

RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 6, 16)).astype(np.float32)
W = (RNG.standard_normal((16, 8)) * 0.3).astype(np.float32)
OUT_SCALE = 0.05


def _converts(fq, atol_lsb=1.0, feed=None):
    """Strict conversion: no float tensor, and outputs within ``atol_lsb`` output steps of the fake-quant."""
    out, report = rewrite(fq)
    assert float_offenders(out) == [] and report.notes["float_islands"] == []
    feed = feed or {"x": X}
    np.testing.assert_allclose(run(out, feed)[0], run(fq, feed)[0], atol=atol_lsb * OUT_SCALE + 1e-6)
    return out, report


def _refused(fq, pattern):
    with pytest.raises(ConversionError, match=pattern) as e:
        rewrite(fq)
    assert "\n" not in str(e.value)
    return str(e.value)


def _qcdq(g: G, x, scale, lo=-127, hi=127):
    """Brevitas' QCDQ: QuantizeLinear → Clip(narrow range) → DequantizeLinear."""
    s, z = g.const(scale), g.const(0, np.int8)
    q = g.node("QuantizeLinear", [x, s, z])
    c = g.node("Clip", [q, g.const(lo, np.int8), g.const(hi, np.int8)])
    return g.node("DequantizeLinear", [c, s, z])


def _qcdq_weight(g: G, w):
    """Brevitas' weights: an int8 initializer, a Clip to [-127, 127], DequantizeLinear (per tensor)."""
    scale = float(np.abs(w).max()) / 127
    q = np.clip(np.rint(w / scale), -128, 127).astype(np.int8)
    c = g.node("Clip", [g.const(q, np.int8), g.const(-127, np.int8), g.const(127, np.int8)])
    return g.node("DequantizeLinear", [c, g.const(scale), g.const(0, np.int8)])


def test_qcdq_clip_on_activations_and_weights():
    g = G()
    x = _qcdq(g, g.input("x", [2, 6, 16]), 0.03)
    y = g.node("MatMul", [x, _qcdq_weight(g, W)])
    g.output(_qcdq(g, y, OUT_SCALE, -100, 100))  # a narrower range than the type's, after a requantize
    out, report = _converts(g.model())
    # the weight's Q (folded at load) → Clip of a constant: fold_constants evaluates it (normalize would too)
    assert report.counts["fold_constants"]["nodes folded"] == 1
    assert report.counts["lower_integer"]["QCDQ Clip (narrow range)"] == 1
    counts = op_counts(out)
    assert counts["MatMulInteger"] == 1 and counts["Clip"] == 2  # the input's Clip stays integer too
    assert np.max(np.abs(run(out, {"x": X * 100})[0])) <= 100 * OUT_SCALE + 1e-6  # the range holds


def test_int16_quantizers_convert_at_opset_21():
    g = G(opset=21)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.001, 0, np.int16)
    y = g.node("MatMul", [x, g.weight(W, axis=1)])
    g.output(g.qdq(y, OUT_SCALE, 0, np.int16))
    out, _ = _converts(g.model())
    assert op_counts(out).get("MatMul") == 1  # int16 operands: an exact int32 MatMul


def _int4_weight_graph():
    g = G(opset=21)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    q = RNG.integers(-8, 8, (16, 8))
    g.inits.append(helper.make_tensor("w4", TensorProto.INT4, [16, 8], q.ravel().tolist()))
    g.inits.append(helper.make_tensor("w4_zp", TensorProto.INT4, [], [0]))
    w = g.node("DequantizeLinear", ["w4", g.const(0.05), "w4_zp"])
    g.output(g.qdq(g.node("MatMul", [x, w]), OUT_SCALE))
    return g.model()


def test_4bit_weights_are_refused_naming_the_node():
    msg = _refused(_int4_weight_graph(), r"DequantizeLinear '.*': 4-bit quantizer \(int4\) is not supported")
    assert "re-export with int8" in msg


@pytest.mark.parametrize(
    "elem, form",
    [
        (TensorProto.UINT4, r"4-bit quantizer \(uint4\)"),
        (TensorProto.FLOAT8E4M3FN, r"floating-point quantizer \(float8_e4m3fn\) has no integer form"),
    ],
)
def test_4bit_and_float8_activation_quantizers_are_refused(elem, form):
    g = G(opset=21)
    x = g.input("x", [2, 6, 16])
    g.inits.append(helper.make_tensor("zp", elem, [], [0]))
    s = g.const(0.1)
    g.output(g.node("DequantizeLinear", [g.node("QuantizeLinear", [x, s, "zp"]), s, "zp"]))
    _refused(g.model(), r"QuantizeLinear '.*': " + form)


def test_per_channel_activation_scales_convert():
    g = G()
    x = g.input("x", [2, 6, 16])
    s, z = g.const(np.linspace(0.01, 0.05, 16)), g.const(np.zeros(16), np.int8)
    x = g.node("DequantizeLinear", [g.node("QuantizeLinear", [x, s, z], axis=2), s, z], axis=2)
    g.output(g.qdq(g.node("MatMul", [x, g.weight(W, axis=1)]), OUT_SCALE))
    _converts(g.model())


def test_per_channel_activation_zero_points_are_refused():
    g = G()
    x = g.input("x", [2, 6, 16])
    s, z = g.const(np.full(16, 0.02)), g.const(np.arange(16), np.uint8)
    x = g.node("DequantizeLinear", [g.node("QuantizeLinear", [x, s, z], axis=2), s, z], axis=2)
    g.output(g.qdq(g.node("MatMul", [x, g.weight(W, axis=1)]), OUT_SCALE))
    _refused(g.model(), r"(Quantize|Dequantize)Linear '.*': per-channel .*zero points .*not supported")


def test_saturate_attribute_and_output_dtype_convert():
    """``saturate`` only concerns float8; ``output_dtype`` (opset 21, no zero point) names the type."""
    g = G(opset=21)
    s = g.const(0.03)
    q = g.node("QuantizeLinear", [g.input("x", [2, 6, 16]), s], saturate=1, output_dtype=TensorProto.INT8)
    y = g.node("MatMul", [g.node("DequantizeLinear", [q, s]), g.weight(W, axis=1)])
    g.output(g.qdq(y, OUT_SCALE))
    fq = g.model()
    _, report = _converts(fq, feed={"x": X - 2})  # negative values: an int8, not uint8, range
    assert report.counts["normalize"]["QuantizeLinear output_dtype made a zero point"] == 1


def test_blocked_quantization_is_refused():
    g = G(opset=21)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    q = RNG.integers(-127, 128, (16, 8)).astype(np.int8)
    w = g.node(
        "DequantizeLinear",
        [g.const(q, np.int8), g.const(np.full((4, 8), 0.01)), g.const(np.zeros((4, 8)), np.int8)],
        axis=0,
        block_size=4,
    )
    g.output(g.qdq(g.node("MatMul", [x, w]), OUT_SCALE))
    _refused(g.model(), r"DequantizeLinear '.*': blocked quantization \(block_size=4\) is not supported")


def test_int8_weight_initializer_with_only_dequantize():
    """Quark/ORT/PT2E store weights as int8 initializers read by a DequantizeLinear: used as they are."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    g.output(g.qdq(g.node("MatMul", [x, g.weight(W, axis=1)]), OUT_SCALE))
    fq = g.model()
    out, _ = _converts(fq)
    w_fq = next(i for i in fq.graph.initializer if i.data_type == TensorProto.INT8 and len(i.dims) == 2)
    mm = next(n for n in out.graph.node if n.op_type == "MatMulInteger")
    w_int = next(i for i in out.graph.initializer if i.name == mm.input[1])
    assert w_int.raw_data == w_fq.raw_data  # the toolkit's integers, unchanged


def test_qdq_around_reshape_and_transpose():
    """Q/DQ on both sides of Reshape/Transpose (ORT, ModelOpt) and a transposed DQ weight (PT2E, Brevitas)."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    x = g.qdq(g.node("Reshape", [x, g.const([2, 6, 4, 4], np.int64)]), 0.03)
    x = g.qdq(g.node("Transpose", [x], perm=[0, 1, 3, 2]), 0.03)
    x = g.qdq(g.node("Reshape", [x, g.const([2, 6, 16], np.int64)]), 0.03)
    w = g.node("Transpose", [g.weight(W.T, axis=0)], perm=[1, 0])
    g.output(g.qdq(g.node("MatMul", [x, w]), OUT_SCALE))
    out, _ = _converts(g.model())
    counts = op_counts(out)
    assert counts["Reshape"] == 2 and counts["Transpose"] == 1 and counts["MatMulInteger"] == 1


def test_fused_gemm_with_trans_b_and_per_channel_weights():
    g = G()
    x = g.qdq(g.input("x", [4, 16]), 0.03)
    b = g.const(RNG.standard_normal(8) * 0.1)
    g.output(g.qdq(g.node("Gemm", [x, g.weight(W.T, axis=0), b], transB=1, alpha=0.5), OUT_SCALE))
    out, _ = _converts(g.model(), feed={"x": X[0, :4]})
    assert op_counts(out).get("MatMulInteger") == 1 and "Gemm" not in op_counts(out)


def _u8(g: G, *shape):
    return g.const(np.zeros(shape), np.uint8)


#: each node in the form a toolkit writes it: (op, domain, inputs, number of outputs, attributes)
ODD_NODES = {
    "MatMulNBits": (
        "com.microsoft",
        lambda g, x: [x, _u8(g, 8, 1, 8), g.const(np.ones((8, 1)))],
        1,
        dict(K=16, N=8, bits=4, block_size=16),
        "block-quantized 2..8-bit weight matmul",
    ),
    "GatherBlockQuantized": (
        "com.microsoft",
        lambda g, x: [_u8(g, 8, 8), g.const(np.zeros((2,)), np.int64), g.const(np.ones((8, 1)))],
        1,
        dict(block_size=16),
        "block-quantized gather",
    ),
    "DynamicQuantizeLinear": ("", lambda g, x: [x], 3, {}, "dynamic quantization"),
    "QLinearMatMul": (
        "",
        lambda g, x: [
            g.node("QuantizeLinear", [x, g.const(0.03), g.const(0, np.uint8)]),
            g.const(0.03),
            g.const(0, np.uint8),
            _u8(g, 16, 8),
            g.const(0.01),
            g.const(0, np.uint8),
            g.const(0.05),
            g.const(0, np.uint8),
        ],
        1,
        {},
        "QOperator format",
    ),
}


@pytest.mark.parametrize("op", sorted(ODD_NODES))
def test_matmulnbits_style_nodes_are_refused(op):
    domain, inputs, n_out, attrs, form = ODD_NODES[op]
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    outs = [f"y{i}" for i in range(n_out)]
    g.nodes.append(helper.make_node(op, inputs(g, x), outs, name="odd", domain=domain, **attrs))
    m = helper.make_model(
        helper.make_graph(
            g.nodes,
            "t",
            g.inputs,
            [helper.make_tensor_value_info("y0", TensorProto.UNDEFINED, None)],
            initializer=g.inits,
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )
    _refused(m, rf"{op} 'odd': {form}")


def test_float_weight_left_by_the_quantizer_is_refused_with_the_reason():
    """ModelOpt leaves GEMMs with fewer than 16 outputs float (a 10-class head): say so, in one line."""
    g = G()
    x = g.qdq(g.input("x", [4, 16]), 0.03)
    g.output(g.node("Gemm", [x, g.const(W.T), g.const(np.zeros(8))], transB=1))
    fq = g.model()
    _refused(fq, r"Gemm '.*': weight '.*' is float \(no DequantizeLinear\): the quantizer left this Gemm")
    out, report = rewrite(fq, allow_float=True)
    assert len(report.notes["float_islands"]) == 1
    np.testing.assert_allclose(run(out, {"x": X[0, :4]})[0], run(fq, {"x": X[0, :4]})[0], atol=1e-5)


def test_allow_float_dequantizes_16_bit_tensors_below_opset_21():
    """An int16 tensor feeding a float island at opset 17 (ModelOpt's head after the final LayerNorm) is
    widened to int32 before its DequantizeLinear, so the output passes the ONNX check."""
    g = G()
    x = g.qdq(g.input("x", [4, 16]), 0.03)
    y = g.node("LayerNormalization", [x, g.const(np.ones(16)), g.const(np.zeros(16))], axis=-1)
    g.output(g.node("Gemm", [y, g.const(W.T), g.const(np.zeros(8))], transB=1))
    fq = g.model()
    out, _ = rewrite(fq, allow_float=True)
    widened = [
        n
        for n in out.graph.node
        if n.op_type == "Cast"
        and n.output[0] in {i for d in out.graph.node if d.op_type == "DequantizeLinear" for i in d.input}
    ]
    assert widened, "the int16 LayerNorm output is widened before it is dequantized"
    a, b = run(fq, {"x": X[0, :4]})[0], run(out, {"x": X[0, :4]})[0]
    assert np.max(np.abs(a - b)) < 0.05 * np.max(np.abs(a))


def _quant(g: G, x, scale, bits, signed=1, narrow=0, mode="ROUND"):
    """A QONNX ``Quant`` node (Brevitas' ``export_qonnx``)."""
    z = g.const(np.zeros_like(np.asarray(scale, np.float32)))
    ins = [x, g.const(scale), z, g.const(float(bits))]
    return g.node(
        "Quant", ins, domain="qonnx.custom_op.general", signed=signed, narrow=narrow, rounding_mode=mode
    )


def _qonnx_model(g: G):
    m = helper.make_model(
        helper.make_graph(
            g.nodes,
            "t",
            g.inputs,
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, [2, 6, 8]) for o in g.outputs],
            initializer=g.inits,
        ),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("qonnx.custom_op.general", 2)],
        ir_version=10,
    )
    return m


def _qonnx_graph(bits_w=8, mode="ROUND"):
    g = G()
    x = _quant(g, g.input("x", [2, 6, 16]), 0.03, 8, narrow=1)
    w = _quant(
        g, g.const(W), np.abs(W).max(axis=0, keepdims=True) / (2 ** (bits_w - 1) - 1), bits_w, mode=mode
    )
    g.output(_quant(g, g.node("MatMul", [x, w]), OUT_SCALE, 8))
    return g


def test_qonnx_quant_converts_like_its_qcdq_twin():
    """8-bit narrow activations and 4-bit per-channel weights: QuantizeLinear → Clip → DequantizeLinear."""
    out, report = rewrite(_qonnx_model(_qonnx_graph(bits_w=4)))
    assert report.counts["normalize"]["QONNX Quant → QuantizeLinear/DequantizeLinear"] == 3
    assert float_offenders(out) == [] and op_counts(out)["MatMulInteger"] == 1
    w = next(i for i in out.graph.initializer if i.data_type == TensorProto.INT8 and len(i.dims) == 2)
    assert np.abs(numpy_helper.to_array(w)).max() <= 7  # the 4-bit range, held in int8
    # the QONNX semantics in numpy, against the converted graph
    q = lambda v, s, lo, hi: np.clip(np.rint(v / s), lo, hi) * s  # noqa: E731
    sw = np.abs(W).max(axis=0, keepdims=True) / 7
    ref = q(q(X, 0.03, -127, 127) @ q(W, sw, -8, 7), OUT_SCALE, -128, 127)
    np.testing.assert_allclose(run(out, {"x": X})[0], ref, atol=OUT_SCALE + 1e-6)


@pytest.mark.parametrize(
    "bits, mode, form",
    [
        (8, "FLOOR", "Quant rounding_mode FLOOR is not supported"),
        (12, "ROUND", "Quant of 12 bits is not supported"),
    ],
)
def test_qonnx_quant_forms_without_an_integer_reading_are_refused(bits, mode, form):
    g = G()
    x = _quant(g, g.input("x", [2, 6, 16]), 0.03, bits, mode=mode)
    g.output(_quant(g, g.node("MatMul", [x, _quant(g, g.const(W), 0.01, 8)]), OUT_SCALE, 8))
    _refused(_qonnx_model(g), rf"Quant '.*': QONNX {form}")


def test_float_clip_on_dequantized_values_converts_exactly():
    """A float Clip (ReLU6-like) of a dequantized tensor is the unary rule's exact table (issue #27;
    tests/passes/test_rule_unary.py): strict, equal to the fake-quant model."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    g.output(g.qdq(g.node("Clip", [x, g.const(0.0), g.const(0.5)]), 0.01))
    _converts(g.model(), atol_lsb=0)
