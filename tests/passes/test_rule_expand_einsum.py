"""expand_einsum (passes/expand_einsum.py): Einsum's matmul forms become Transpose / Unsqueeze / MatMul /
Squeeze, lowered to an integer GEMM equal to the fake-quant Einsum within one output step; other forms stay
float islands with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from ivit_onnx.passes.expand_einsum import parse, plan
from tests.graphs import G, op_counts
from tests.passes._rules import RNG, declines, lowered

CASES = {  # equation: operand shapes
    "bhqd,bhkd->bhqk": [(2, 3, 5, 8), (2, 3, 7, 8)],  # attention scores
    "bhqk,bhkd->bhqd": [(2, 3, 5, 7), (2, 3, 7, 8)],  # attention times values
    "bnd,dm->bnm": [(2, 5, 8), (8, 6)],  # a linear layer
    "bd,nd->bn": [(4, 8), (6, 8)],  # one row per operand
    "...ij,...jk->...ik": [(2, 3, 5, 8), (2, 3, 8, 6)],  # ellipsis
    "ij,jk": [(5, 8), (8, 6)],  # implicit output: ik
    "nd,bhd->bhn": [(5, 8), (2, 3, 8)],  # the second operand's extra free indices
    "bd,d->b": [(4, 8), (8,)],  # a row and no column
}


@pytest.mark.parametrize("equation", list(CASES))
def test_matmul_forms_equal_the_fake_quant_einsum(equation):
    g = G()
    shapes = CASES[equation]
    xs = [g.qdq(g.input(f"x{i}", list(s)), 0.05, 0) for i, s in enumerate(shapes)]
    g.output(g.qdq(g.node("Einsum", xs, equation=equation), 0.1, 0))
    feeds = {f"x{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    out, report = lowered(g.model(), feeds, atol=0.1 + 1e-6)
    assert report.counts["expand_einsum"]["Einsum → MatMul"] == 1
    assert op_counts(out).get("MatMulInteger") == 1 and "Einsum" not in op_counts(out)


def test_a_permutation_is_a_transpose():
    g = G()
    x = g.qdq(g.input("x", [2, 5, 8]), 0.05, 0)
    g.output(g.qdq(g.node("Einsum", [x], equation="bij->bji"), 0.05, 0))
    out, report = lowered(g.model(), {"x": RNG.standard_normal((2, 5, 8)).astype(np.float32)}, atol=1e-6)
    assert report.counts["expand_einsum"]["Einsum → Transpose"] == 1 and "Einsum" not in op_counts(out)


@pytest.mark.parametrize("equation, reason", [
    ("bij,bjk->ik", "contracts 2 indices"),
    ("ii->i", "a repeated index"),
    ("bij,bjk->bk", "sums index 'i' of one operand only"),
])  # fmt: skip
def test_other_forms_are_refused_with_the_reason(equation, reason):
    with pytest.raises(ValueError, match=reason):
        terms, out = parse(equation, [3] * (equation.split("->")[0].count(",") + 1))
        plan(terms, out)


def test_an_unsupported_einsum_is_an_island_with_the_reason():
    g = G()
    xs = [g.qdq(g.input(f"x{i}", [2, 5, 8]), 0.05, 0) for i in range(2)]
    g.output(g.qdq(g.node("Einsum", xs, equation="bij,bij->b"), 0.1, 0))
    declines(g.model(), "Einsum", "contracts 2 indices")
