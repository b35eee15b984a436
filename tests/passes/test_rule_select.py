"""Selections and index writes (passes/rules/select.py): ReduceMax/ReduceMin/GlobalMaxPool/TopK and
ScatterND/ScatterElements run on the integers and give exactly the fake-quant values (TopK's indices too);
scatters of two types decline."""

from __future__ import annotations

import numpy as np
import pytest

from tests.graphs import G, op_counts, run
from tests.passes._rules import RNG, X, declines, lowered

IMG = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("zp, dtype, opset", [(4, np.int8, 18), (9, np.uint8, 18), (-7, np.int16, 21)])
def test_order_reductions_are_exact(op, zp, dtype, opset):
    """The same reduction on the integers (16-bit widened to int32 and back: onnxruntime's kernels)."""
    g = G(opset=opset)
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, zp, dtype)
    g.output(g.qdq(g.node(op, [x, g.const([1], np.int64)], keepdims=0), 0.03, zp, dtype))
    out, report = lowered(g.model(), {"x": X}, 1e-6)
    assert op_counts(out).get(op) == 1 and report.counts["lower_integer"][f"{op} on the integers"] == 1


@pytest.mark.parametrize("opset", [17, 18])
def test_global_max_pool_is_a_reduce_max(opset):
    g = G(opset=opset)
    x = g.qdq(g.input("img", [1, 2, 6, 6]), 0.03, 7, np.uint8)
    g.output(g.qdq(g.node("GlobalMaxPool", [x]), 0.03, 7, np.uint8))
    out, _ = lowered(g.model(), {"img": IMG}, 1e-6)
    assert op_counts(out).get("ReduceMax") == 1 and "GlobalMaxPool" not in op_counts(out)


def test_topk_values_and_indices_are_exact():
    """TopK on the integers: the values keep the type, the int64 indices are the fake-quant ones (ties
    included: equal integers are equal values)."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.1, 3)
    values, idx = g.node("TopK", [x, g.const([5], np.int64)], n_out=2, axis=-1)
    g.output(g.qdq(values, 0.1, 3))
    g.output(idx)
    out, _ = lowered(g.model(), {"x": X}, 1e-6)
    got, ref = run(out, {"x": X}), run(g.model(), {"x": X})
    assert np.array_equal(got[1], ref[1]) and got[1].dtype == np.int64
    assert op_counts(out).get("TopK") == 1


@pytest.mark.parametrize("op", ["ScatterND", "ScatterElements"])
def test_scatter_of_one_type_is_exact(op):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 2)
    if op == "ScatterND":
        idx, upd = g.const([[0, 1], [1, 4]], np.int64), g.qdq(g.input("u", [2, 16]), 0.03, 2)
    else:
        idx, upd = g.const(RNG.integers(0, 6, (2, 2, 16)), np.int64), g.qdq(g.input("u", [2, 2, 16]), 0.03, 2)
    attrs = {} if op == "ScatterND" else {"axis": 1}
    g.output(g.qdq(g.node(op, [x, idx, upd], **attrs), 0.03, 2))
    u = RNG.standard_normal((2, 16) if op == "ScatterND" else (2, 2, 16)).astype(np.float32)
    out, _ = lowered(g.model(), {"x": X, "u": u}, 1e-6)
    assert op_counts(out).get(op) == 1


@pytest.mark.parametrize(
    "case, op, reason",
    [
        ("scatter", "ScatterND", "are not of one quantized type"),
        ("float", "TopK", "input 'x' is not quantized"),
    ],
)
def test_declines_with_the_reason(case, op, reason):
    g = G(opset=18)
    if case == "scatter":
        x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
        y = g.node("ScatterND", [x, g.const([[0, 1]], np.int64), g.qdq(g.input("u", [1, 16]), 0.05)])
    else:
        y = g.node("TopK", [g.input("x", [2, 6, 16]), g.const([5], np.int64)], n_out=2, axis=-1)[0]
    g.output(g.qdq(y, 0.05))
    declines(g.model(), op, reason)
