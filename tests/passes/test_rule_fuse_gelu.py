"""fuse_gelu: each decomposed GELU form collapses into one Gelu and computes the same values; a Gelu left
as a float island at an old opset goes back to standard ops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ivit_onnx import Pipeline, rewrite
from tests.graphs import G, op_counts, run
from tests.passes._rules import fusion_declines

X = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)


def _fuse(model, upto):
    return Pipeline.default().run(model, stop_after=upto)


def _gelu_graph(form: str, qdq_inside: bool):
    g = G(opset=20)
    x = g.qdq(g.input("x", [2, 5, 8]), 0.05)
    q = (lambda t: g.qdq(t, 0.05)) if qdq_inside else (lambda t: t)
    if form in ("tanh", "tanh_pow"):
        cube = (
            g.node("Mul", [x, g.node("Mul", [x, x])]) if form == "tanh" else g.node("Pow", [x, g.const(3.0)])
        )
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
        elif form == "div_two":  # x * (1 + erf) / 2
            out = g.node("Div", [g.node("Mul", [x, one_plus]), g.const(2.0)])
        else:  # (0.5 * x) * (1 + erf)
            out = g.node("Mul", [g.node("Mul", [g.const(0.5), x]), one_plus])
    g.output(g.qdq(out, 0.05))
    return g.model()


@pytest.mark.parametrize("form", ["x_first", "half_first", "half_x", "div_two", "tanh", "tanh_pow"])
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


def test_gelu_left_as_float_island_is_valid_at_old_opsets():
    """A fused GELU that cannot be lowered (its input is not quantized) goes back to standard ops."""
    g = G()
    x = g.input("x", [2, 6, 16])
    e = g.node("Erf", [g.node("Div", [x, g.const(np.sqrt(2.0))])])
    y = g.node("Mul", [g.node("Mul", [x, g.node("Add", [e, g.const(1.0)])]), g.const(0.5)])
    g.output(g.qdq(y, 0.02))
    fq = g.model()
    out, report = rewrite(fq, allow_float=True)
    assert "Gelu" not in op_counts(out) and op_counts(out).get("Erf") == 1
    assert any("Gelu" in i for i in report.notes["float_islands"])
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 6, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(out, feeds)[0], run(fq, feeds)[0], atol=1e-6)


@pytest.mark.parametrize("form", ["x_first", "tanh"])
def test_fused_gelu_lowers_to_shiftgelu_within_two_output_steps(form):
    model = _gelu_graph(form, qdq_inside=False)
    out, _ = rewrite(model)
    assert op_counts(out).get("ai.ivit:ShiftGELU") == 1
    assert np.max(np.abs(run(out, {"x": X})[0] - run(model, {"x": X})[0])) <= 2 * 0.05 + 1e-6


def _quick_gelu_graph(qdq_inside: bool, x_first: bool, quantized: bool = True):
    """CLIP's quick_gelu ``x * sigmoid(1.702 x)`` (either Mul order), Q/DQ inside as quantize_static puts
    them."""
    g = G()
    x = g.input("x", [2, 5, 8])
    x = g.qdq(x, 0.05) if quantized else g.node("Sin", [x])
    q = (lambda t: g.qdq(t, 0.05)) if qdq_inside else (lambda t: t)
    s = q(g.node("Sigmoid", [q(g.node("Mul", [x, g.const(1.702)] if x_first else [g.const(1.702), x]))]))
    g.output(g.qdq(g.node("Mul", [x, s] if x_first else [s, x]), 0.05))
    return g.model()


@pytest.mark.parametrize("x_first", [False, True])
@pytest.mark.parametrize("qdq_inside", [False, True])
def test_quick_gelu_fuses_and_lowers_to_shiftgelu_close_to_the_fake_quant_graph(qdq_inside, x_first):
    """quick_gelu becomes one Gelu, then ShiftGELU (which computes x * sigmoid(1.702 x) itself): cosine
    >= 0.99 with the fake-quant quick_gelu graph and at most two output steps apart (ShiftGELU's shift-exp
    sigmoid plus the rounding; the inner Q/DQ pairs the fused op drops add at most one more)."""
    model = _quick_gelu_graph(qdq_inside, x_first)
    fused, report = _fuse(model, "fuse_gelu")
    assert op_counts(fused).get("Gelu") == 1 and "Sigmoid" not in op_counts(fused)
    assert report.counts["fuse_gelu"]["GELU (quick_gelu: x * sigmoid(1.702 x))"] == 1
    out, _ = rewrite(model)
    assert op_counts(out).get("ai.ivit:ShiftGELU") == 1
    xs = X * 3
    a, b = run(model, {"x": xs})[0].ravel(), run(out, {"x": xs})[0].ravel()
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.99
    assert np.max(np.abs(a - b)) <= (2 + qdq_inside) * 0.05 + 1e-6


def test_quick_gelu_of_a_float_x_is_not_fused():
    """Fused, a float island's Gelu would compute erf-GELU: quick_gelu of an unquantized x stays as it is."""
    fusion_declines(
        _quick_gelu_graph(False, True, quantized=False), "fuse_gelu", "x * sigmoid(1.702 x) of a float x"
    )
