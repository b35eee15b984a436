"""Products (passes/rules/product.py): Mul/Div of a quantized tensor by a float constant of any sign and
broadcast shape, and Mul of two quantized tensors, as an exact integer product and one Requantize.

Bound: the Requantize rounds the exact real product once (half up, a dyadic multiplier), the fake-quant model
rounds ``float32(x * k)`` once (half to even): at most one output step apart, equal except near ties.
"""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import ConversionError, rewrite
from tests.graphs import G, op_counts, run
from tests.passes._rules import backends_agree, declines, lowered

RNG = np.random.default_rng(11)
X = (RNG.standard_normal((2, 6, 16)) * 1.5).astype(np.float32)
S_IN = float(np.max(np.abs(X))) / 120
X[0, 0, :2] = (-1000, 1000)  # saturate to both ends of every input type (int8 -128 / 127, uint8 0 / 255)


def _within_one_step(fq, out, feeds, step):
    """At most one output step apart everywhere, and equal on almost every element."""
    got, ref = run(out, feeds)[0].astype(np.float64), run(fq, feeds)[0]
    diff = np.abs(got - ref)
    assert np.max(diff) <= step * (1 + 1e-6)
    assert np.mean(diff > step / 2) < 0.02


@pytest.mark.parametrize(
    "shape", [(16,), (1, 1, 16), (6, 16), (2, 6, 1), ()], ids=["C", "11C", "TC", "NT1", "scalar"]
)
@pytest.mark.parametrize("dtype, zp", [(np.int8, 0), (np.uint8, 128), (np.uint8, 37)])
def test_constant_of_any_sign_and_shape_is_one_requantize(shape, dtype, zp):
    """A layer scale with negative entries, a [T, C] sin/cos table, a scalar -0.7: one Requantize with a
    signed multiplier per element (zero entries included), the old decline gone."""
    k = RNG.standard_normal(shape) if shape else np.array(-0.7)
    k = np.where(np.abs(k) < 0.1, 0.0, k)  # zero entries: multiplier 0
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN, zp, dtype)
    g.output(g.qdq(g.node("Mul", [x, g.const(k)]), 0.021))
    fq = g.model()
    out, report = lowered(fq, {"x": X}, atol=0.021 * (1 + 1e-6))
    assert report.counts["lower_integer"]["Mul → product"] == 1
    assert op_counts(out).get("ai.ivit:Requantize") == 1 and "Mul" not in op_counts(out)
    _within_one_step(fq, out, {"x": X}, 0.021)
    backends_agree(out, {"x": X})  # signed per-element multipliers, zeros among them


def test_negative_layer_scale_no_longer_declines():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN)
    g.output(g.qdq(g.node("Mul", [x, g.const(np.linspace(-0.3, 0.2, 16))]), 0.011))
    out, report = rewrite(g.model())  # strict: raised "not a quantized tensor scaled by a positive constant"
    assert not report.notes["float_islands"]
    assert "scaled by a positive constant" not in report.summary()


def test_table_broadcasting_the_tensor_up_is_expanded():
    """An [N, 1, C] tensor times a [T, C] table: the integers are broadcast to [N, T, C] before the
    Requantize."""
    g = G()
    x = g.qdq(g.input("x", [2, 1, 16]), S_IN)
    table = np.sin(np.arange(6)[:, None] / (10 ** (np.arange(16) / 16)))
    g.output(g.qdq(g.node("Mul", [g.const(table), x]), 0.02))
    fq = g.model()
    xs = X[:, :1]
    out, _ = lowered(fq, {"x": xs}, atol=0.02 * (1 + 1e-6))
    assert op_counts(out).get("Expand") == 1 and run(out, {"x": xs})[0].shape == (2, 6, 16)
    backends_agree(out, {"x": xs})


def test_division_by_a_negative_constant():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN)
    g.output(g.qdq(g.node("Div", [x, g.const(-np.linspace(0.5, 4, 16))]), 0.013))
    fq = g.model()
    out, report = lowered(fq, {"x": X}, atol=0.013 * (1 + 1e-6))
    assert report.counts["lower_integer"]["Div → product"] == 1
    _within_one_step(fq, out, {"x": X}, 0.013)


def test_positive_constant_still_folds_exactly():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    g.output(g.qdq(g.node("Mul", [x, g.const(np.full(16, 0.5))]), 0.015))
    out, report = lowered(g.model(), {"x": X}, atol=1e-6)
    assert report.counts["lower_integer"]["Mul by constant folded"] == 1
    assert "Mul → product" not in report.counts["lower_integer"]


@pytest.mark.parametrize("dtype, zp", [(np.int8, 0), (np.uint8, 37)])
def test_without_a_quantize_after_it_the_product_is_exact(dtype, zp):
    """No QuantizeLinear after the Mul (a graph output): ``(q - zx) sign(k)`` in int16 at scale ``s |k|``, the
    real product to float32 rounding; the extreme -128 * -1 = 128 needs the int16."""
    k = np.linspace(-1.5, 1.5, 16)
    k[7] = 0.0
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN, zp, dtype)
    g.output(g.node("Mul", [x, g.const(k)]))
    fq = g.model()
    xs = X.copy()
    xs[0, 0, 0] = -200.0  # saturates to qmin
    out, _ = lowered(fq, {"x": xs}, atol=2e-6 * 128 * S_IN * 1.5)
    ref = run(fq, {"x": xs})[0]
    assert ref[0, 0, 0] == pytest.approx((np.iinfo(dtype).min - zp) * S_IN * -1.5, rel=1e-6)


@pytest.mark.parametrize("dtype, zp", [(np.int8, 0), (np.uint8, 128), (np.uint8, 37)])
def test_silu_is_the_sigmoid_table_then_a_product_of_two_activations(dtype, zp):
    """MobileViT's SiLU ``x * sigmoid(x)``: the Sigmoid as a table, then the int32 product of two 8-bit
    tensors (zero points removed first) and one Requantize."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN, zp, dtype)
    s = g.qdq(g.node("Sigmoid", [x]), 1 / 255, 0, np.uint8)
    g.output(g.qdq(g.node("Mul", [x, s]), 0.02, zp, dtype))
    fq = g.model()
    out, report = lowered(fq, {"x": X}, atol=0.02 * (1 + 1e-6))
    counts = report.counts["lower_integer"]
    assert counts["Mul → product"] == 1 and counts["Sigmoid → table lookup (Gather)"] == 1
    assert op_counts(out).get("Mul") == 1  # the int32 product
    _within_one_step(fq, out, {"x": X}, 0.02)
    backends_agree(out, {"x": X})


@pytest.mark.parametrize("quantized_after", [True, False])
def test_product_of_activations_broadcast_and_per_channel(quantized_after):
    """[N, T, C] times [N, T, 1] activations, one of them per-channel after a positive layer-scale fold. With
    nothing quantized after it the int32 product's scale (per channel times per row) is made per tensor: one
    requantize, within one step of that finest scale."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN)
    gate = g.qdq(g.node("ReduceMean", [x], axes=[2], keepdims=1), 0.01)
    x2 = g.node("Mul", [x, g.const(np.linspace(0.5, 2.0, 16))])  # folds: a per-channel scale
    y = g.node("Mul", [x2, gate])
    g.output(g.qdq(y, 0.003) if quantized_after else y)
    fq = g.model()
    step = 0.003 if quantized_after else S_IN * 0.5 * 0.01
    out, report = lowered(fq, {"x": X}, atol=step * (1 + 1e-6))
    assert report.counts["lower_integer"]["Mul → product"] == 1
    if quantized_after:
        _within_one_step(fq, out, {"x": X}, step)


def test_declines_one_line_naming_the_node():
    """Div by a quantized tensor has no integer rule: one line naming the Div and why."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN)
    y = g.qdq(g.input("y", [2, 6, 16]), S_IN)
    g.output(g.qdq(g.node("Div", [x, y]), 0.05))
    fq = g.model()
    with pytest.raises(ConversionError) as e:
        rewrite(fq)
    assert "\n" not in str(e.value) and "Div '" in str(e.value)
    declines(fq, "Div", "is not a constant: no integer division")


def test_product_of_two_int32_accumulators_is_narrowed_to_fit_int32():
    """Two MatMul accumulators with no QuantizeLinear between (NNCF leaves RoFormer's rotary projections so):
    their product could overflow int32, so both are requantized to widths whose product fits first; the
    result stays within two output steps of the fake-quant graph."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN)
    a = g.node("MatMul", [x, g.weight(RNG.standard_normal((16, 16)), axis=1)])
    b = g.node("MatMul", [x, g.weight(RNG.standard_normal((16, 16)), axis=1)])
    g.output(g.qdq(g.node("Mul", [a, b]), 0.05))
    _, report = lowered(g.model(), {"x": X}, 2 * 0.05 + 1e-6)
    assert report.counts["lower_integer"]["operands narrowed to fit int32"] == 1


@pytest.mark.parametrize("positive", [False, True])
def test_two_axis_table_without_a_quantize_after_it_is_an_int16_factor(positive):
    """A [T, C] table and nothing quantized after the Mul: the exact scale ``s |k|`` would vary along two axes
    (no per-channel type holds it), so ``k`` is quantized to int16 per tensor and multiplied in int32; a
    positive table, which the fold would take, goes the same way. Error: ``|x| max|k| / 65534``."""
    k = np.random.default_rng(5).standard_normal((6, 16))
    k = np.abs(k) if positive else k
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), S_IN)
    g.output(g.node("Mul", [x, g.const(k)]))
    fq = g.model()
    out, report = lowered(fq, {"x": X}, atol=128 * S_IN * np.max(np.abs(k)) / 65534 + 1e-6)
    assert report.counts["lower_integer"]["Mul → product"] == 1 and op_counts(out).get("Mul") == 1
