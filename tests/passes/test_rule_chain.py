"""Several rules for one op type (passes/rules/chain.py): ``FirstOf`` lowers with the first rule that matches
and does not decline, joins every rule's reason when all decline; ``ahead`` puts rules in front of a table."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from ivit_onnx.passes.pattern import Op, Rule, Var, match
from ivit_onnx.passes.rules import RULES, chain, masked_pool, token_mask
from tests.graphs import G
from tests.passes._rules import declines


class _Fake(Rule):
    def __init__(self, op, why):
        self.pattern, self.why = Op(op, Var("x")), why

    def check(self, lw, m):
        return self.why

    def rewrite(self, lw, m):
        return self.why or self


def _node(op):
    return gs.Node(
        op, inputs=[gs.Variable("x", np.float32, [2])], outputs=[gs.Variable("y", np.float32, [2])]
    )


def test_first_rule_that_does_not_decline_rewrites():
    first, second = _Fake("Relu", "first declines"), _Fake("Relu", None)
    rule = chain.FirstOf(first, second, _Fake("Relu", None))
    m = match(rule.pattern, _node("Relu"))
    assert rule.check(None, m) is None and rule.rewrite(None, m) is second


def test_all_declining_joins_the_reasons_once_each():
    rule = chain.FirstOf(_Fake("Relu", "a"), _Fake("Tanh", "never"), _Fake("Relu", "a"), _Fake("Relu", "b"))
    assert rule.check(None, match(rule.pattern, _node("Relu"))) == "a; pattern does not match; b"


def test_ahead_puts_the_extra_rules_first_and_keeps_the_rest():
    table = {"Relu": _Fake("Relu", "old"), "Tanh": _Fake("Tanh", "kept")}
    new = chain.ahead(table, (_Fake("Relu", "new"), _Fake("Sigmoid", "only")))
    assert new["Tanh"] is table["Tanh"] and [r.why for r in new["Relu"].rules] == ["new", "old"]
    assert [r.why for r in new["Sigmoid"].rules] == ["only"] and "Sigmoid" not in table
    assert RULES["ReduceSum"].rules[0] is masked_pool.RULES[1]
    assert isinstance(RULES["Cast"].rules[0], token_mask.MaskCast)


def test_a_graph_declined_by_every_rule_reports_each_reason():
    """A Cast of a quantized tensor to int32: the token-mask Cast and the layout Cast both decline."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    y = g.node("Cast", [g.node("Cast", [x], to=TensorProto.INT32)], to=TensorProto.FLOAT)
    g.output(g.qdq(y, 0.05))
    declines(
        g.model(), "Cast", "not a cast to float or bool; a Cast of a quantized tensor to a non-float type"
    )
