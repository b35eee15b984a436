"""Masked mean pooling (passes/rules/masked_pool.py): ``x * mask``, the token count, the integer sum, the
count's Clip and the rounded division, each in integers; every reason to decline. The division against the
exact rational (Python's fractions): tests/models/test_bert_rules.py (its graph builder is reused here)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.graphs import G, op_counts
from tests.models.test_bert_rules import S_X, S_Y, _pool_graph
from tests.passes._rules import RNG, X, declines, lowered

LABELS = [
    "masked tokens",
    "mask count",
    "integer ReduceSum",
    "integer Clip",
    "masked mean (integer division)",
]


def test_mean_pooling_is_within_one_output_step():
    feeds = {"x": (RNG.integers(-127, 128, (3, 5, 4)) * S_X).astype(np.float32)}
    feeds["mask"] = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.int64)
    out, report = lowered(_pool_graph(), feeds, S_Y * 1.0001)
    assert all(report.counts["lower_integer"][k] == 1 for k in LABELS), report.counts
    assert "Div" in op_counts(out) and "ReduceMean" not in op_counts(out)


@pytest.mark.parametrize("lo, hi", [(-0.5, 1.0), (0.0, None)])
def test_clip_with_bounds_on_the_grid_is_exact(lo, hi):
    g = G()
    bounds = [g.const(v) if v is not None else "" for v in (lo, hi)]
    g.output(g.qdq(g.node("Clip", [g.qdq(g.input("x", [2, 6, 16]), 0.25), *bounds]), 0.25))
    out, report = lowered(g.model(), {"x": X}, 1e-6)
    assert op_counts(out).get("Clip") == 1


def _decline_graph(case):
    g = G()
    f, f2 = g.input("f", [2, 4]), g.input("f2", [2, 4])
    x = g.qdq(g.input("x", [2, 4]), S_X, 3 if case == "div_zp" else 0)
    m = g.node("Cast", [g.input("mask", [2, 4], TensorProto.INT64)], to=TensorProto.FLOAT)
    one_minus = g.node("Sub", [g.const(1.0), m])
    axis = g.const([1], np.int64)
    count = g.node("ReduceSum", [m, axis], keepdims=1)
    count = count if case == "div_unclipped" else g.node("Clip", [count, g.const(1.0)])
    w = (
        g.weight(np.ones((64, 64)), axis=1)
        if case == "sum_per_channel"
        else g.qdq(g.const(np.ones((64, 64))), 1 / 127)
    )
    matmul = g.node("MatMul", [g.qdq(g.input("t", [1, 2100, 64]), 0.03), w])  # |acc| <= 64 * 127 * 127
    y = {
        "mul_float": lambda: g.node("Mul", [f, f2]),
        "mul_values": lambda: g.node("Mul", [x, one_minus]),
        "sum_float": lambda: g.node("ReduceSum", [f, axis]),
        "count_values": lambda: g.node("ReduceSum", [one_minus, axis]),
        "sum_per_channel": lambda: g.node("ReduceSum", [matmul, axis]),
        "sum_overflow": lambda: g.node("ReduceSum", [matmul, axis]),
        "clip_float": lambda: g.node("Clip", [f, g.const(0.0)]),
        "clip_bound": lambda: g.node("Clip", [x, g.input("lo", [])]),
        "div_float": lambda: g.node("Div", [f, f2]),
        "div_zp": lambda: g.node("Div", [x, count]),
    }.get(case, lambda: g.node("Div", [g.node("ReduceSum", [x, axis]), count]))()  # div_*: a mean
    g.output(g.qdq(y, {"div_int32": 1e-9, "div_int64": 1e10}.get(case, S_Y)))
    return g.model()


@pytest.mark.parametrize(
    "case, op, reason",
    [
        ("mul_float", "Mul", "not an integer tensor times a token mask"),
        ("mul_values", "Mul", "the token mask's values are not 0 and > 0"),
        ("sum_float", "ReduceSum", "input is not a token mask; input is not quantized, or the axes are not"),
        ("count_values", "ReduceSum", "not a 0/k mask over constant axes"),
        ("sum_per_channel", "ReduceSum", "per-channel input"),
        ("sum_overflow", "ReduceSum", "a sum of 2100 values may overflow int32"),
        ("clip_float", "Clip", "input is not quantized per tensor, or no bounds"),
        ("clip_bound", "Clip", "bound 'lo' is not a scalar constant"),
        ("div_float", "Div", "sum or count is not quantized"),
        ("div_zp", "Div", "sum and count must be per-tensor integers with zero point 0"),
        ("div_unclipped", "Div", "the divisor is not an integer clipped to at least 1"),
        ("div_int64", "Div", "overflows int64"),
        ("div_int32", "Div", "the mean does not fit int32 before its clip"),
    ],
)
def test_declines_with_the_reason(case, op, reason):
    declines(_decline_graph(case), op, reason)


def _sentence_graph(normalize: bool, dtype=np.int8, same_mask: bool = True, opset: int = 18):
    """sentence-transformers' pooling as its models export it: ``sum(x * mask) / clamp(sum(mask), 1e-9)``,
    then ``F.normalize`` (ReduceL2, Clip 1e-12, Expand, Div) or not; no QuantizeLinear after either: the
    output is the float embedding."""
    g = G(opset=opset)
    x = g.qdq(g.input("x", [3, 5, 4]), S_X, 0, dtype)
    mask = g.node("Cast", [g.input("mask", [3, 5], TensorProto.INT64)], to=TensorProto.FLOAT)
    wide = g.node("Unsqueeze", [mask, g.const([2], np.int64)])
    wide = g.node("Expand", [wide, g.const([3, 5, 4], np.int64)])
    masked = g.node("Mul", [x, wide]) if same_mask else x
    total = g.node("ReduceSum", [masked, g.const([1], np.int64)], keepdims=0)
    count = g.node("Clip", [g.node("ReduceSum", [wide, g.const([1], np.int64)], keepdims=0), g.const(1e-9)])
    y = g.node("Div", [total, count])
    if normalize:
        norm = g.node("Clip", [g.node("ReduceL2", [y, g.const([1], np.int64)], keepdims=1), g.const(1e-12)])
        y = g.node("Div", [y, g.node("Expand", [norm, g.node("Shape", [y])])])
    g.output(y)
    return g.model()


POOL_FEEDS = {
    "x": (RNG.integers(-127, 128, (3, 5, 4)) * S_X).astype(np.float32),
    "mask": np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.int64),  # an empty row too
}


@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_transformers_pooling_is_integer_to_the_output(normalize):
    """The 1e-9 clamp of the token count is 1 (the sum is 0 wherever the count is), the mean with no
    QuantizeLinear after it is int16 over the largest token (one step: S_X / 258), and F.normalize of it is
    IL2Norm (int16 at 2**-15 out): integer-only to the one DequantizeLinear of the output."""
    fq = _sentence_graph(normalize)
    atol = 3 * 2**-15 if normalize else S_X * 127 / 32767
    out, report = lowered(fq, POOL_FEEDS, atol)
    counts = report.counts["lower_integer"]
    assert counts["masked mean (integer division)"] == 1 and counts["integer Clip"] == 1
    assert counts.get("IL2Norm", 0) == int(normalize)


def test_a_ceiled_count_needs_the_sum_of_the_same_mask():
    """Without the mask on the sum, an empty row divides a non-zero sum by 1e-9, not by 1: declined."""
    declines(_sentence_graph(False, same_mask=False), "Div", "the sum is not masked by the same mask")


def test_a_16_bit_pooled_tensor_masks_in_int32():
    """onnxruntime's CPU provider has no 16-bit Where: the masked tokens of an int16 tensor are selected in
    int32 between two Casts, and the model runs (the mean: int16 over the input's bound, one step S_X)."""
    out, _ = lowered(_sentence_graph(False, np.int16, opset=21), POOL_FEEDS, S_X)
    wheres = [n for n in out.graph.node if n.op_type == "Where"]
    assert wheres and all(n.output[0] for n in wheres)
