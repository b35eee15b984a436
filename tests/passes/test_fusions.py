"""Fusion passes: each decomposed form collapses into one op and computes the same values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ivit_onnx import Pipeline
from tests.graphs import G, op_counts, run

X = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)


def _fuse(model, upto):
    return Pipeline.default().run(model, stop_after=upto)


def _gelu_graph(form: str, qdq_inside: bool):
    g = G(opset=20)
    x = g.qdq(g.input("x", [2, 5, 8]), 0.05)
    q = (lambda t: g.qdq(t, 0.05)) if qdq_inside else (lambda t: t)
    if form == "tanh":
        cube = g.node("Mul", [x, g.node("Mul", [x, x])])
        inner = g.node("Add", [x, g.node("Mul", [cube, g.const(0.044715)])])
        t = q(g.node("Tanh", [q(g.node("Mul", [inner, g.const(math.sqrt(2 / math.pi))]))]))
        one_plus = q(g.node("Add", [t, g.const(1.0)]))
        out = g.node("Mul", [g.node("Mul", [x, g.const(0.5)]), one_plus])
    else:
        e = q(g.node("Erf", [q(g.node("Div", [x, g.const(math.sqrt(2))]))]))
        one_plus = q(g.node("Add", [e, g.const(1.0)]))
        if form == "x_first":  # torch: x * (1 + erf) * 0.5
            out = g.node("Mul", [g.node("Mul", [x, one_plus]), g.const(0.5)])
        elif form == "half_first":  # (1 + erf) * 0.5 * x
            out = g.node("Mul", [g.node("Mul", [one_plus, g.const(0.5)]), x])
        else:  # (0.5 * x) * (1 + erf)
            out = g.node("Mul", [g.node("Mul", [g.const(0.5), x]), one_plus])
    g.output(g.qdq(out, 0.05))
    return g.model()


@pytest.mark.parametrize("form", ["x_first", "half_first", "half_x", "tanh"])
@pytest.mark.parametrize("qdq_inside", [False, True])
def test_gelu_forms_fuse_to_one_gelu(form, qdq_inside):
    model = _gelu_graph(form, qdq_inside)
    fused, report = _fuse(model, "fuse_gelu")
    counts = op_counts(fused)
    assert counts.get("Gelu") == 1
    assert not {"Erf", "Tanh"} & set(counts)
    assert sum(report.counts["fuse_gelu"].values()) == 1
    a, b = run(model, {"x": X})[0], run(fused, {"x": X})[0]
    # without inner Q/DQ the fused graph computes the same real function (to one output LSB)
    tol = 0.05 + 1e-6 if not qdq_inside else 0.05 * 3
    assert np.max(np.abs(a - b)) <= tol


def test_gelu_with_wrong_constant_is_left_alone():
    g = G(opset=20)
    x = g.qdq(g.input("x", [2, 5, 8]), 0.05)
    e = g.node("Erf", [g.node("Div", [x, g.const(1.3)])])
    out = g.node("Mul", [g.node("Mul", [x, g.node("Add", [e, g.const(1.0)])]), g.const(0.5)])
    g.output(g.qdq(out, 0.05))
    fused, report = _fuse(g.model(), "fuse_gelu")
    assert "Gelu" not in op_counts(fused) and not report.counts.get("fuse_gelu")


def _layernorm_graph(square: str):
    g = G(opset=17)
    x = g.qdq(g.input("x", [2, 5, 8]), 0.05)
    mean = g.node("ReduceMean", [x], axes=[-1])
    d = g.node("Sub", [x, mean])
    sq = g.node("Pow", [d, g.const(2.0)]) if square == "pow" else g.node("Mul", [d, d])
    var = g.node("ReduceMean", [sq], axes=[-1])
    std = g.node("Sqrt", [g.node("Add", [var, g.const(1e-5)])])
    y = g.node("Div", [d, std])
    gamma = np.linspace(0.5, 1.5, 8).astype(np.float32)
    y = g.node("Add", [g.node("Mul", [y, g.const(gamma)]), g.const(np.full(8, 0.1, np.float32))])
    g.output(g.qdq(y, 0.05))
    return g.model()


@pytest.mark.parametrize("square", ["pow", "mul"])
def test_decomposed_layernorm_fuses(square):
    model = _layernorm_graph(square)
    fused, report = _fuse(model, "fuse_layernorm")
    counts = op_counts(fused)
    assert counts.get("LayerNormalization") == 1 and "Sqrt" not in counts and "ReduceMean" not in counts
    np.testing.assert_allclose(run(fused, {"x": X})[0], run(model, {"x": X})[0], atol=0.05 + 1e-6)


def test_decomposed_softmax_fuses():
    g = G(opset=13)
    x = g.qdq(g.input("x", [2, 5, 8]), 0.05)
    e = g.node("Exp", [g.node("Sub", [x, g.node("ReduceMax", [x], axes=[-1])])])
    s = g.node("ReduceSum", [e, g.const([-1], np.int64)])
    g.output(g.qdq(g.node("Div", [e, s]), 1 / 256, 0, np.uint8))
    model = g.model()
    fused, report = _fuse(model, "fuse_softmax")
    assert op_counts(fused).get("Softmax") == 1 and "Exp" not in op_counts(fused)
    np.testing.assert_allclose(run(fused, {"x": X})[0], run(model, {"x": X})[0], atol=1 / 256 + 1e-6)
