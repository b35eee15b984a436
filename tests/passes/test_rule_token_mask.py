"""Token masks (passes/rules/token_mask.py): float tensors computed from the 0/1 int64 mask input (Cast,
layout ops, arithmetic with scalars, Where/Not) carried as two values, and ``TokenMaskedAdd`` masking a
Softmax with them in integers; every reason to decline. Exact zeros with -10000 / finfo.min and the
refused ``(1 - mask) * -1``: tests/models/test_bert_rules.py (its graph builder is reused here)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.graphs import G, op_counts, run
from tests.models.test_bert_rules import _masked_softmax
from tests.passes._rules import RNG, declines, lowered

FEEDS = {
    "s": (RNG.integers(-127, 128, (2, 1, 4, 4)) * 0.05).astype(np.float32),
    "mask": np.array([[1, 1, 0, 0], [1, 0, 1, 0]], np.int64),
}


def _masked_softmax_where(bool_mask: bool):
    """``Softmax(scores + Where(Not(bool(mask)), -1e4, 0))``, or ``+ float(bool(mask)) * 1e4`` (kept keys
    raised instead of masked ones lowered: the same softmax)."""
    g = G()
    scores = g.qdq(g.input("s", [2, 1, 4, 4]), 0.05)
    m = g.node("Cast", [g.input("mask", [2, 4], TensorProto.INT64)], to=TensorProto.BOOL)
    m = g.node("Reshape", [m, g.const([2, 1, 1, 4], np.int64)])
    m = g.node("Where", [g.node("Not", [m]), g.const(-1e4), g.const(0.0)]) if bool_mask else m
    m = m if bool_mask else g.node("Mul", [g.node("Cast", [m], to=TensorProto.FLOAT), g.const(1e4)])
    g.output(g.qdq(g.node("Softmax", [g.node("Add", [scores, m])], axis=-1), 1 / 256, 0, np.uint8))
    return g.model()


@pytest.mark.parametrize("build", ["arith", "where", "cast_bool_float"])
def test_token_mask_sets_masked_probabilities_to_exactly_zero(build):
    fq = {
        "arith": lambda: _masked_softmax(-10000.0, expand=True),
        "where": lambda: _masked_softmax_where(True),
        "cast_bool_float": lambda: _masked_softmax_where(False),
    }[build]()
    out, report = lowered(fq, FEEDS, 6 / 256)
    assert report.counts["lower_integer"]["token mask (two-valued)"] >= 3
    assert op_counts(out).get("Where") == 1 and "Softmax" not in op_counts(out)
    assert np.all(run(out, FEEDS)[0].transpose(0, 3, 1, 2)[FEEDS["mask"] == 0] == 0)


def _hf_mask(gather: str, keep_all: bool = True):
    """Hugging Face transformers 5's padding mask with fixed shapes (after fold_constants): the bool mask
    indexed by Gather (TorchScript: flattened, per-token indices) or GatherND (dynamo), ANDed with the
    all-True bidirectional mask, then ``Where(mask, 0, -inf)`` added to the scores."""
    g = G()
    scores = g.qdq(g.input("s", [2, 1, 4, 4]), 0.05)
    m = g.node("Cast", [g.input("mask", [2, 4], TensorProto.INT64)], to=TensorProto.BOOL)
    if gather == "Gather":
        flat = g.node("Reshape", [g.node("Flatten", [m], axis=2), g.const([-1], np.int64)])
        idx = (np.arange(2)[:, None, None, None] * 4 + np.arange(4)).astype(np.int64)  # entry b * L + j
        m = g.node("Gather", [flat, g.const(idx, np.int64)], axis=0)
    else:
        b, j = np.meshgrid(np.arange(2), np.arange(4), indexing="ij")
        idx = np.stack([b, j], -1).reshape(2, 1, 1, 4, 2).astype(np.int64)
        m = g.node("GatherND", [m, g.const(idx, np.int64)])
    bidir = np.ones((1, 1, 4, 1), bool) if keep_all else np.tril(np.ones((4, 4), bool))[None, None]
    m = g.node("And", [g.const(bidir, np.bool_), m])
    bias = g.node("Where", [m, g.const(0.0), g.const(-np.inf)])
    g.output(g.qdq(g.node("Softmax", [g.node("Add", [scores, bias])], axis=-1), 1 / 256, 0, np.uint8))
    return g.model()


@pytest.mark.parametrize("gather", ["Gather", "GatherND"])
def test_hugging_face_padding_mask(gather):
    out, report = lowered(_hf_mask(gather), FEEDS, 6 / 256)
    assert "Softmax" not in op_counts(out) and "And" not in op_counts(out)
    assert np.all(run(out, FEEDS)[0].transpose(0, 3, 1, 2)[FEEDS["mask"] == 0] == 0)


def test_and_with_a_causal_constant_declines():
    declines(_hf_mask("GatherND", keep_all=False), "And", "the constant is not true everywhere")


def _decline_graph(case):
    g = G()
    f, f2 = g.input("f", [2, 4]), g.input("f2", [2, 4])
    mask = g.input("mask", [2, 4], TensorProto.INT64)
    as_bool, as_float = (g.node("Cast", [mask], to=t) for t in (TensorProto.BOOL, TensorProto.FLOAT))
    x = g.qdq(g.input("x", [2, 4]), 0.05)
    if case in ("add_no_softmax", "add_wide", "add_small"):
        scores = g.qdq(g.input("s", [2, 1, 4, 4]), 1e-9 if case == "add_wide" else 0.05)
        k = g.node(
            "Mul", [g.node("Sub", [g.const(1.0), as_float]), g.const(-1.0 if case == "add_small" else -1e4)]
        )
        y = g.node("Add", [scores, g.node("Unsqueeze", [k, g.const([1, 2], np.int64)])])
        y = y if case == "add_no_softmax" else g.node("Softmax", [y], axis=-1)
    else:
        y = {
            "cast_int": lambda: g.node(
                "Cast", [g.node("Cast", [x], to=TensorProto.INT32)], to=TensorProto.FLOAT
            ),
            "cast_bool": lambda: g.node(
                "Cast", [g.node("Cast", [x], to=TensorProto.BOOL)], to=TensorProto.FLOAT
            ),
            "layout": lambda: g.node("Reshape", [f, g.const([8], np.int64)]),
            "arith_two": lambda: g.node("Mul", [f, f2]),
            "arith_k": lambda: g.node("Mul", [as_float, f]),
            "where_cond": lambda: g.node("Where", [g.input("b", [2, 4], TensorProto.BOOL), g.const(0.0), f]),
            "where_branch": lambda: g.node("Where", [as_bool, f, g.const(0.0)]),
            "add_plain": lambda: g.node("Add", [f, f2]),
        }[case]()
    g.output(g.qdq(y, 0.05))
    return g.model()


@pytest.mark.parametrize(
    "case, op, reason",
    [
        ("cast_int", "Cast", "not a cast to float or bool"),
        ("cast_bool", "Cast", "input is not an integer graph input (a 0/1 mask) nor a token mask"),
        ("layout", "Reshape", "input is not a token mask"),
        ("arith_two", "Mul", "not one token mask and one constant"),
        ("arith_k", "Mul", "'f' is not a scalar float constant"),
        ("where_cond", "Where", "condition is not a token mask"),
        ("where_branch", "Where", "branches are not scalar constants"),
        ("add_plain", "Add", "not integer scores plus a token mask"),
        ("add_no_softmax", "Add", "the sum does not reach a last-axis Softmax through reshapes"),
        ("add_wide", "Add", "leaves no int32 room to mask"),
        ("add_small", "Add", "(kept) and -1 (masked) do not mask the softmax"),
    ],
)
def test_declines_with_the_reason(case, op, reason):
    declines(_decline_graph(case), op, reason)
