"""Rules for Add / Mul / Div (passes/rules/elementwise.py): bias adds, residual IAdd, constant scalings."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import rewrite
from tests.graphs import G, op_counts, run
from tests.passes._rules import RNG, X, declines, lowered


def test_residual_add_of_different_scales_is_one_iadd_within_one_lsb():
    g = G()
    x = g.input("x", [2, 6, 16])
    a, b = g.qdq(x, 0.02), g.qdq(g.node("Mul", [x, g.const(0.7)]), 0.013)
    g.output(g.qdq(g.node("Add", [a, b]), 0.05))
    fq = g.model()
    out, _ = rewrite(fq, allow_float=True)
    assert op_counts(out).get("ai.ivit:IAdd") == 1
    diff = np.abs(run(fq, {"x": X})[0] - run(out, {"x": X})[0])
    assert np.max(diff) <= 0.05 + 1e-6  # at most one output LSB where the rounding differs


def test_add_of_a_constant_is_an_iadd_of_its_int16_copy():
    g = G()
    pos = g.const(RNG.standard_normal((6, 16)) * 0.3)
    g.output(g.qdq(g.node("Add", [pos, g.qdq(g.input("x", [2, 6, 16]), 0.03)]), 0.05))
    out, _ = lowered(g.model(), {"x": X}, 0.05 + 1e-6)
    assert op_counts(out).get("ai.ivit:IAdd") == 1


def test_bias_of_an_accumulator_is_an_int32_add():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    y = g.node("MatMul", [x, g.weight(RNG.standard_normal((16, 8)) * 0.3, axis=1)])
    g.output(g.qdq(g.node("Add", [g.const(RNG.standard_normal(8) * 0.2), y]), 0.05))
    out, report = lowered(g.model(), {"x": X}, 0.05 + 1e-6)
    assert report.counts["lower_integer"]["bias Add (int32)"] == 1 and "ai.ivit:IAdd" not in op_counts(out)


@pytest.mark.parametrize("op, k", [("Mul", 0.25), ("Div", 8.0)])
def test_scaling_by_a_positive_constant_is_folded_exactly(op, k):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    ins = [g.const(k), x] if op == "Mul" else [x, g.const(k)]
    g.output(g.qdq(g.node(op, ins), 0.03 / 4 if op == "Mul" else 0.03 / 8))
    out, report = lowered(g.model(), {"x": X}, 1e-6)
    assert report.counts["lower_integer"][f"{op} by constant folded"] == 1 and op not in op_counts(out)


@pytest.mark.parametrize(
    "case, op, reason",
    [
        ("float_inputs", "Add", "no input is quantized"),
        ("float_operand", "Add", "input 'y' is not quantized nor a constant"),
        ("float_factor", "Mul", "input 'y' is not quantized nor a constant"),
    ],
)
def test_declines_with_the_reason(case, op, reason):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    if case == "float_inputs":
        y = g.node("Add", [g.input("a", [2, 6, 16]), g.input("b", [2, 6, 16])])
        y = g.node("Add", [g.qdq(y, 0.05), x])
    elif case == "float_operand":
        y = g.node("Add", [x, g.input("y", [2, 6, 16])])
    else:  # a negative constant is a product now (tests/passes/test_rule_product.py)
        y = g.node("Mul", [x, g.input("y", [2, 6, 16])])
    g.output(g.qdq(y, 0.05))
    declines(g.model(), op, reason)


def test_a_rule_that_cannot_compute_its_parameters_declines_with_the_error():
    """A ValueError inside a rule (here: no IAdd shift fits a 1e17 scale ratio) stops strict mode naming
    the node; with allow_float the node stays float with that reason."""
    g = G()
    x = g.input("x", [2, 6, 16])
    y = g.node("Add", [g.qdq(x, 1.0), g.qdq(g.node("Mul", [x, g.const(0.5)]), 1.0)])
    g.output(g.qdq(y, 1e-17))
    declines(g.model(), "Add", "scale ratio too large for IAdd")
