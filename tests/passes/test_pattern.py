"""The rule API (passes/pattern.py): commutation, Q/DQ look-through, one binding per pattern object,
alternatives that leave no bindings behind, and a FusePass built from a rule."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx import Pipeline
from ivit_onnx.passes.pattern import Const, FusePass, OneOf, Op, Rule, Var, match
from tests.graphs import G, op_counts, run


def _graph(build):
    g = G(opset=17)
    x = g.qdq(g.input("x", [2, 8]), 0.05)
    g.output(g.qdq(build(g, x), 0.05))
    return gs.import_onnx(g.model())


def _root(graph, op):
    return next(n for n in graph.nodes if n.op == op)


def test_commutative_inputs_match_either_way_round():
    p = Op("Mul", Var("x"), Const(2.0, name="k"))
    for order in (lambda g, x: [x, g.const(2.0)], lambda g, x: [g.const(2.0), x]):
        graph = _graph(lambda g, x, order=order: g.node("Mul", order(g, x)))
        m = match(p, _root(graph, "Mul"))
        assert m is not None and float(m.k) == 2.0 and m.x.name.startswith("dequantizelinear")
    graph = _graph(lambda g, x: g.node("Div", [g.const(2.0), x]))
    assert match(Op("Div", Var("x"), Const(2.0)), _root(graph, "Div")) is None  # Div does not commute


def test_edges_step_over_qdq_pairs_and_one_object_binds_one_tensor():
    d = Op("Neg", Var("x"))
    square = Op("Mul", d, d)
    graph = _graph(lambda g, x: g.node("Mul", [g.qdq(n := g.node("Neg", [x]), 0.1), n]))
    assert match(square, _root(graph, "Mul")) is not None
    graph = _graph(lambda g, x: g.node("Mul", [g.node("Neg", [x]), g.node("Neg", [x])]))
    assert match(square, _root(graph, "Mul")) is None  # two different Neg nodes


def test_failed_alternative_leaves_no_binding():
    x = Var("x")
    p = Op("Exp", OneOf(Op("Sub", x, Op("ReduceMax", Var("other"), name="max")), x))
    graph = _graph(lambda g, x: g.node("Exp", [g.node("Sub", [x, g.const(1.0)])]))
    m = match(p, _root(graph, "Exp"))
    assert m is not None and "max" not in m and "other" not in m and m.x.name.startswith("sub")


def test_a_rule_in_a_fuse_pass_rewrites_and_counts():
    class Relu6(Rule):  # Min(Max(x, 0), 6) -> Clip(x, 0, 6)
        pattern = Op("Min", Op("Max", Var("x"), Const(0.0)), Const(6.0))
        label = "ReLU6"

        def rewrite(self, ctx, m):
            return (
                "Clip",
                [m.x, gs.Constant("lo", np.array(0, np.float32)), gs.Constant("hi", np.array(6, np.float32))],
                {},
            )

    class FuseRelu6(FusePass):
        name, suffix, rules = "fuse_relu6", "relu6", (Relu6(),)

    g = G(opset=17)
    x = g.qdq(g.input("x", [2, 8]), 0.05)
    g.output(g.qdq(g.node("Min", [g.const(6.0), g.node("Max", [x, g.const(0.0)])]), 0.05))
    model = g.model()
    p = Pipeline.default()
    p.insert_after("normalize", FuseRelu6())
    fused, report = p.run(model, stop_after="fuse_relu6")
    assert op_counts(fused).get("Clip") == 1 and "Min" not in op_counts(fused)
    assert report.counts["fuse_relu6"] == {"ReLU6": 1} and "fuse_relu6: ReLU6 1" in report.summary()
    feeds = {"x": np.linspace(-8, 8, 16, dtype=np.float32).reshape(2, 8) / 2}
    np.testing.assert_array_equal(run(fused, feeds)[0], run(model, feeds)[0])
