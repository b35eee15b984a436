"""SDPA's NaN guard (passes/rules/nan_guard.py): ``Where(IsNaN(p), 0, p)`` of an integer ``p`` is ``p``, with
the softmax quantized before the guard (onnxruntime) or not (NNCF); a guard of a float tensor stays."""

from __future__ import annotations

import pytest

from tests.graphs import G, op_counts
from tests.passes._rules import X, declines, lowered


def _guarded(quantized_softmax: bool):
    g = G()
    x = g.qdq(g.input("x", ["N", 6, 16]), 0.05)
    p = g.node("Softmax", [x], axis=-1)
    p = g.qdq(p, 1 / 128) if quantized_softmax else p
    guarded = g.node("Where", [g.node("IsNaN", [p]), g.const(0.0), p])
    g.output(g.qdq(guarded, 1 / 128))
    return g.model()


@pytest.mark.parametrize("quantized_softmax", [True, False])
def test_guard_of_an_integer_softmax_is_the_softmax(quantized_softmax):
    out, report = lowered(_guarded(quantized_softmax), {"x": X}, atol=3 / 128)  # Shiftmax: within 3 steps
    assert report.counts["lower_integer"]["Where(IsNaN(p), c, p) → p (integers are never NaN)"] == 1
    assert not {"IsNaN", "Where", "Softmax"} & set(op_counts(out))


def test_guard_of_a_float_tensor_is_an_island():
    g = G()
    x = g.qdq(g.input("x", ["N", 6, 16]), 0.05)
    y = g.node("Hardmax", [x])
    g.output(g.qdq(g.node("Where", [g.node("IsNaN", [y]), g.const(0.0), y]), 1 / 128))
    declines(g.model(), "Where", "condition is not IsNaN of an integer tensor")
