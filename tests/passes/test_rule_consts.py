"""Constant subgraphs (passes/rules/consts.py): ``constant_value`` evaluates what only constants feed, and
gives None for a variable, a Q/DQ, a walk longer than ``MAX_NODES`` or what onnx.reference cannot run."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from ivit_onnx.passes.rules import consts
from tests.graphs import G


def _tensor(build):
    """The tensor ``build(g)`` returns, in the imported graph of a model with it as output."""
    g = G()
    g.output(build(g))
    graph = gs.import_onnx(g.model())
    return graph.tensors()[graph.outputs[0].name]


def _chain(g, n):
    t = g.const([1.0, 2.0])
    for _ in range(n):
        t = g.node("Identity", [t])
    return t


CASES = {
    "plain": (lambda g: g.node("Identity", [g.const([3.0])]), [3.0]),
    "pads": (
        lambda g: g.node(
            "Concat", [g.const([0, 1], np.int64), g.node("Neg", [g.const([2, 0], np.int64)])], axis=0
        ),
        [0, 1, -2, 0],
    ),
    "mask": (
        lambda g: g.node("Unsqueeze", [g.const([0.0, -100.0]), g.const([0], np.int64)]),
        [[0.0, -100.0]],
    ),
    "short_chain": (lambda g: _chain(g, consts.MAX_NODES - 1), [1.0, 2.0]),
    "variable": (lambda g: g.node("Add", [g.input("x", [2]), g.const([1.0, 1.0])]), None),
    "qdq": (lambda g: g.node("Identity", [g.qdq(g.const([0.5]), 0.1)]), None),
    "long_chain": (lambda g: _chain(g, consts.MAX_NODES + 1), None),
    "unevaluable": (
        lambda g: g.node("Identity", [g.node("Reshape", [g.const([1.0, 2.0]), g.const([3], np.int64)])]),
        None,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_constant_value(case):
    build, want = CASES[case]
    got = consts.constant_value(_tensor(build), 17)
    assert (got is None) if want is None else np.array_equal(got, want), got
