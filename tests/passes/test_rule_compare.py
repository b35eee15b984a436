"""Comparisons and arg-selections (passes/rules/compare.py): ArgMax/ArgMin on the integers, comparisons with a
scalar constant as a boolean table equal to the fake-quant model on every input, comparisons of one integer
type on the integers; other forms decline with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.graphs import G, op_counts, run
from tests.passes._rules import RNG, X, declines

#: every int8 input value once, and the constant's neighbourhood densely
EVERY = (np.arange(-128, 128, dtype=np.float32) * 0.03).reshape(2, 8, 16)


def _exact(fq, feeds) -> None:
    """Integer-only and equal to the fake-quant model on every output (booleans and indices)."""
    from ivit_onnx import rewrite
    from ivit_onnx.certify import float_offenders

    out, report = rewrite(fq)
    assert float_offenders(out) == []
    for got, ref in zip(run(out, feeds), run(fq, feeds), strict=True):
        assert got.dtype == ref.dtype and np.array_equal(got, ref)
    return out, report


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype, opset", [(np.int8, 17), (np.int16, 21)])
def test_arg_extremes_are_the_integers(op, dtype, opset):
    g = G(opset=opset)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 0, dtype)
    g.output(g.node(op, [x], axis=-1, keepdims=0))
    out, report = _exact(g.model(), {"x": np.round(X * 4) / 4})  # ties too
    assert report.counts["lower_integer"][f"{op} on the integers"] == 1


@pytest.mark.parametrize("op", ["Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"])
@pytest.mark.parametrize("value, constant_first", [(0.3, False), (0.36, False), (-1.0, True)])
def test_comparison_with_a_constant_is_a_table_equal_on_every_input(op, value, constant_first):
    """0.36 lies on the int8 grid (12 × 0.03, up to float rounding), 0.3 too; the table is the fake-quant
    subgraph's own result on every integer, so even the rounding of 12 × 0.03 agrees."""
    g = G()
    x = g.qdq(g.input("x", [2, 8, 16]), 0.03, 0)
    c = g.const(np.float32(value))
    g.output(g.node(op, [c, x] if constant_first else [x, c]))
    out, report = _exact(g.model(), {"x": EVERY})
    assert report.counts["lower_integer"][f"{op} → boolean table (Gather)"] == 1
    assert "Gather" in op_counts(out)


def test_comparison_of_one_integer_type():
    g = G()
    x, y = (g.qdq(g.input(n, [2, 6, 16]), 0.03, 0) for n in ("x", "y"))
    g.output(g.node("Greater", [x, y]))
    out, report = _exact(g.model(), {"x": X, "y": RNG.standard_normal(X.shape).astype(np.float32)})
    assert report.counts["lower_integer"]["Greater of one integer type"] == 1


def test_two_types_or_a_tensor_constant_decline():
    g = G()
    x, y = g.qdq(g.input("x", [2, 6, 16]), 0.03, 0), g.qdq(g.input("y", [2, 6, 16]), 0.05, 0)
    g.output(g.node("Cast", [g.node("Less", [x, y])], to=TensorProto.INT32))
    declines(g.model(), "Less", "different integer types")
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 0)
    g.output(g.node("Cast", [g.node("Less", [x, g.const(np.linspace(0, 1, 16))])], to=TensorProto.INT32))
    declines(g.model(), "Less", "is not a scalar constant")
