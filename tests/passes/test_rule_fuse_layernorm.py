"""fuse_layernorm: decomposed LayerNorm becomes LayerNormalization with the same values, in the forms
exporters and quantizers leave: Pow (float or integer 2) or Mul square, Div, Reciprocal or ``1 / std``,
optional gamma/beta, ``x - mean`` twice, Q/DQ pairs on every edge inside, reductions over a non-last axis
(channels first, or before a Transpose that moves that axis last, as ``quant_pre_process`` leaves them);
each reason to decline is reported."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx import Pipeline
from tests.graphs import G, op_counts, run
from tests.passes._rules import fusion_declines, lowered

X = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
X_CF = np.ascontiguousarray(X.transpose(0, 2, 1))  # channels first: [2, 8, 5]
OUT = 0.05  # the output's scale


def _layernorm_graph(
    square="pow",
    divide="div",
    affine=True,
    mean_axis=-1,
    eps=1e-5,
    last="8",
    layout="last",
    inside=False,
    twice=False,
    eps_outside=False,
    gamma_shape=None,
):
    """A decomposed LayerNorm of ``x`` (Q/DQ'd) over its last axis; ``layout`` "channels_first" reduces
    axis 1 of a [2, 8, 5] input (gamma/beta [8, 1]), "transposed" adds the Transpose that moves it last;
    ``inside`` puts a Q/DQ pair on every intermediate edge (onnxruntime's quantizer)."""
    g = G(opset=17)
    cf = layout != "last"
    shape = [2, 8, 5] if cf else [2, 5, 8 if last == "8" else last]
    axis = 1 if cf else -1
    x = g.qdq(g.input("x", shape), 0.05)

    def q(t, scale, zp=0, dtype=np.int8):
        return g.qdq(t, scale, zp, dtype) if inside else t

    mean = q(g.node("ReduceMean", [x], axes=[axis if mean_axis == -1 else mean_axis]), 0.01)
    d = q(g.node("Sub", [x, mean]), 0.05)
    d2 = q(g.node("Sub", [x, mean]), 0.05) if twice else d
    two = g.const(2, np.int64) if square == "pow_int" else g.const(2.0)
    sq = g.node("Pow", [d2, two]) if square.startswith("pow") else g.node("Mul", [d2, d2])
    var = q(g.node("ReduceMean", [q(sq, 16 / 255, 0, np.uint8)], axes=[axis]), 4 / 255, 0, np.uint8)
    if eps_outside:
        std = g.node("Add", [g.node("Sqrt", [var]), g.const(eps)])
    else:
        std = g.node("Sqrt", [q(g.node("Add", [var, g.const(eps)]), 4 / 255, 0, np.uint8)])
    std = q(std, 2 / 255, 0, np.uint8)
    if divide == "div":
        y = g.node("Div", [d, std])
    else:
        inv = g.node("Reciprocal", [std]) if divide == "rcp" else g.node("Div", [g.const(1.0), std])
        y = g.node("Mul", [d, q(inv, 0.1)])
    if affine:
        c = 8 if cf or last == "8" else last
        cshape = gamma_shape or ([c, 1] if cf else [c])
        n = int(np.prod(cshape))
        gamma = np.linspace(0.5, 1.5, n).astype(np.float32).reshape(cshape)
        beta = np.linspace(-0.2, 0.3, n).astype(np.float32).reshape(cshape)
        y = g.node("Add", [q(g.node("Mul", [q(y, 0.04), g.const(gamma)]), 0.05), g.const(beta)])
    if layout == "transposed":
        y = g.node("Transpose", [g.qdq(y, OUT)], perm=[0, 2, 1])
    g.output(g.qdq(y, OUT))
    return g.model()


def _feeds(layout):
    return {"x": X if layout == "last" else X_CF}


FORMS = {
    "pow_div": {},
    "mul_div": {"square": "mul"},
    "mul_rcp_plain": {"square": "mul", "divide": "rcp", "affine": False},
    "pow_int_one_over": {"square": "pow_int", "divide": "one_over"},
    "sub_twice": {"twice": True},
    "channels_first": {"layout": "channels_first"},
    "transposed": {"layout": "transposed", "divide": "rcp"},
}


@pytest.mark.parametrize("form", FORMS)
def test_decomposed_layernorm_fuses(form):
    kw = FORMS[form]
    model = _layernorm_graph(**kw)
    fused, report = Pipeline.default().run(model, stop_after="fuse_layernorm")
    counts = op_counts(fused)
    assert counts.get("LayerNormalization") == 1 and not {"Sqrt", "ReduceMean", "Pow", "Sub"} & set(counts)
    assert report.counts["fuse_layernorm"] == {"LayerNorm (decomposed)": 1}
    feeds = _feeds(kw.get("layout", "last"))
    np.testing.assert_allclose(run(fused, feeds)[0], run(model, feeds)[0], atol=OUT + 1e-6)  # 1 step


@pytest.mark.parametrize("form", ["pow_div", "mul_rcp_plain", "sub_twice", "channels_first", "transposed"])
def test_quantized_inside_converts(form):
    """Q/DQ on every intermediate edge: fused (the pairs dropped), lowered to ILayerNorm, integer-only, and
    within 3 output steps of the fake-quant graph (its intermediate roundings: d by 1/2 step, the variance
    by 1/2 of 4/255 near 1, the normalized value by 1/2 of 0.04, gamma up to 1.5)."""
    kw = FORMS[form]
    model = _layernorm_graph(inside=True, **kw)
    out, report = lowered(model, _feeds(kw.get("layout", "last")), 3 * OUT)
    assert report.counts["fuse_layernorm"] == {"LayerNorm (decomposed)": 1}
    assert op_counts(out).get("ai.ivit:ILayerNorm") == 1


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        ({"mean_axis": 1}, "ReduceMean over different, several or unknown axes (or keepdims=0)"),
        ({"eps": np.full(8, 1e-5)}, "epsilon is not a scalar"),
        ({"last": "c", "affine": False}, "the channel count is unknown"),
        ({"eps_outside": True}, "epsilon added outside the square root: not a LayerNorm"),
    ],
)
def test_declines_with_the_reason(kwargs, reason):
    fusion_declines(_layernorm_graph(**kwargs), "fuse_layernorm", reason)


def test_gamma_along_another_axis_stays_a_product():
    """A gamma that varies along another axis than the normalized one is not a LayerNorm's: the normalization
    alone fuses, the Mul and Add stay (elementwise ops of their own), and the report says why."""
    model = _layernorm_graph(layout="channels_first", gamma_shape=[8, 5])
    fused, report = Pipeline.default().run(model, stop_after="fuse_layernorm")
    counts = op_counts(fused)
    assert counts.get("LayerNormalization") == 1 and counts.get("Mul") == 1 and counts.get("Add") == 1
    why = "fuse_layernorm: gamma varies along another axis than the normalized one"
    assert why in report.notes["declined"].values(), report.notes
    np.testing.assert_allclose(run(fused, {"x": X_CF})[0], run(model, {"x": X_CF})[0], atol=OUT + 1e-6)
