"""Table lookups (passes/rules/lookup.py): Tanh / Sigmoid of an 8-bit input, quantized after, as a Gather of
a 256-entry table equal to the fake-quant model; an int32 accumulator through an int16 table within one output
step; a float input declined."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import declines, lowered

#: every int8 input value once
EVERY = (np.arange(-128, 128, dtype=np.float32) * 0.03).reshape(2, 8, 16)


@pytest.mark.parametrize("op", ["Tanh", "Sigmoid"])
@pytest.mark.parametrize("dtype, zp", [(np.int8, 0), (np.uint8, 128), (np.uint8, 37)])
def test_table_equals_the_fake_quant_model_on_every_input(op, dtype, zp):
    g = G()
    x = g.qdq(g.input("x", [2, 8, 16]), 0.03, zp, dtype)
    g.output(g.qdq(g.node(op, [x]), 1 / 127, 0 if op == "Tanh" else -128))
    fq = g.model()
    out, report = lowered(fq, {"x": EVERY}, atol=0)
    assert op_counts(out).get("Gather") == 1 and op not in op_counts(out)
    assert report.counts["lower_integer"][f"{op} → table lookup (Gather)"] == 1


@pytest.mark.parametrize("op", ["Tanh", "Sigmoid"])
def test_int32_accumulator_input_within_one_output_step(op):
    """NNCF's pooler: a Gemm's int32 accumulator (not requantized) into Tanh, whose output a per-channel Mul
    (SmoothQuant) reads before the QuantizeLinear: an int16 requantize, a 65536-entry table into int16."""
    g = G()
    x = g.qdq(g.input("x", [2, 16]), 0.03)
    w = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    y = g.node(op, [g.node("MatMul", [x, g.weight(w, axis=1)])])
    y = g.node("Mul", [y, g.const(np.linspace(0.5, 2.0, 8))])
    g.output(g.qdq(y, 2 / 127))
    xs = (np.random.default_rng(4).standard_normal((2, 16)) * 2).astype(np.float32)
    out, report = lowered(g.model(), {"x": xs}, atol=2 / 127 + 1e-6)
    assert report.counts["lower_integer"][f"{op} → table lookup (Gather)"] == 1


#: every other tabulated function, on every int8 input value (scale 0.03: [-3.84, 3.81]) or, where the
#: function is NaN below 0 or above 1, on every uint8 value (zero point 0) of a range inside its domain
DOMAINS = {"Sqrt": 0.03, "Log": 0.03, "Asin": 1 / 255, "Acos": 1 / 255, "Atanh": 1 / 256}


@pytest.mark.parametrize("op, attrs, extra", [
    ("Sin", {}, None), ("Cos", {}, None), ("Tan", {}, None), ("Atan", {}, None), ("Sinh", {}, None),
    ("Cosh", {}, None), ("Asinh", {}, None), ("Exp", {}, None), ("Reciprocal", {}, None),
    ("Round", {}, None), ("Floor", {}, None), ("Ceil", {}, None), ("Sign", {}, None),
    ("Pow", {}, 3.0), ("Sqrt", {}, None), ("Log", {}, None), ("Asin", {}, None),
    ("Acos", {}, None), ("Atanh", {}, None),
])  # fmt: skip
def test_every_function_equals_the_fake_quant_model(op, attrs, extra):
    """Each is ``Q(f(DQ(q)))`` tabulated by onnxruntime itself: equal on every input value (inf, e.g. Log(0)
    and 1/0, saturates in the QuantizeLinear as it does in the fake-quant model)."""
    g = G(opset=21)
    if op in DOMAINS:
        scale = DOMAINS[op]
        x = g.qdq(g.input("x", [2, 8, 16]), scale, 0, np.uint8)
        feed = (np.arange(256, dtype=np.float32) * scale).reshape(2, 8, 16)
    else:
        x, feed = g.qdq(g.input("x", [2, 8, 16]), 0.03), EVERY
    args = [x] if extra is None else [x, g.const(np.float32(extra))]
    g.output(g.qdq(g.node(op, args, **attrs), 0.05, 0, np.int16))
    out, report = lowered(g.model(), {"x": feed}, atol=0)
    assert op not in op_counts(out) and report.counts["lower_integer"][f"{op} → table lookup (Gather)"] == 1


def test_nan_on_the_input_range_declines():
    """Sqrt of a negative input is NaN in the fake-quant model: no table value to agree on."""
    g = G()
    g.output(g.qdq(g.node("Sqrt", [g.qdq(g.input("x", [2, 6, 16]), 0.03)]), 0.05))
    declines(g.model(), "Sqrt", "is NaN on the input's range")


def test_a_tensor_exponent_declines():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    g.output(g.qdq(g.node("Pow", [x, g.qdq(g.input("e", [2, 6, 16]), 0.03)]), 0.05))
    declines(g.model(), "Pow", "is not a constant")


def test_float_input_declines():
    g = G()
    x = g.input("x", [2, 6, 16])
    y = g.node("Tanh", [g.node("Hardmax", [g.qdq(x, 0.03)])])
    g.output(g.qdq(y, 1 / 127))
    declines(g.model(), "Tanh", "is not quantized")
