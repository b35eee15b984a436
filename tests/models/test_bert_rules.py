"""The BERT rules on tiny graphs: masked mean pooling (passes/rules/masked_pool.py) equals the exact rational
``sum * b / (count * 2**c)`` rounded half up, and the float mean to one output step; token masks
(passes/rules/token_mask.py) that are too small to mask a softmax are refused with a reason."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from ivit_onnx import ConversionError, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import G, run

S_X, S_Y = 0.05, 0.01  # token scale; pooled-output scale (finer, so the division's rounding shows)


def _pool_graph(zp_y: int = 0):
    """``Q(sum(DQ(Q(x)) * mask, 1) / max(sum(mask, 1), 1))`` as Hugging Face's mean pooling exports it."""
    g = G()
    x = g.qdq(g.input("x", [None, None, 4]), S_X)
    mask = g.node("Cast", [g.input("mask", [None, None], TensorProto.INT64)], to=TensorProto.FLOAT)
    masked = g.node("Mul", [x, g.node("Unsqueeze", [mask, g.const([2], np.int64)])])
    total = g.node("ReduceSum", [masked, g.const([1], np.int64)], keepdims=0)
    count = g.node("Clip", [g.node("ReduceSum", [mask, g.const([1], np.int64)], keepdims=1), g.const(1.0)])
    g.output(g.qdq(g.node("Div", [total, count]), S_Y, zp_y))
    return g.model()


def _const(model: onnx.ModelProto, node_suffix: str) -> int:
    """The integer constant operand of the converted graph's node named ``*<node_suffix>``."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.name.endswith(node_suffix))
    return int(next(inits[i] for i in node.input if i in inits).reshape(-1)[0])


@pytest.mark.parametrize("zp_y", [0, -7])
def test_masked_mean_is_the_exact_rounded_rational(zp_y):
    fq = _pool_graph(zp_y)
    model, report = rewrite(fq)
    assert float_offenders(model) == []
    assert report.counts["lower_integer"]["masked mean (integer division)"] == 1
    b2, half = _const(model, "/scaled"), _const(model, "/half_den")  # 2*b and 2**c
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (64, 12, 4))
    q[:4] = 127  # extremes: the largest sums
    q[4:8] = -127
    mask = (rng.random((64, 12)) < 0.6).astype(np.int64)
    mask[8] = 0  # an empty sequence: count clipped to 1, the mean 0
    mask[9] = 1
    (got,) = run(model, {"x": (q * S_X).astype(np.float32), "mask": mask})
    (ref,) = run(fq, {"x": (q * S_X).astype(np.float32), "mask": mask})
    got_q = np.rint(got / S_Y).astype(np.int64) + zp_y
    sums, counts = (q * mask[:, :, None]).sum(1), np.maximum(mask.sum(1, keepdims=True), 1)
    expected = np.vectorize(
        lambda s, n: int(np.floor(Fraction(int(s) * b2, 2 * int(n) * half) + Fraction(1, 2)))
    )(sums, counts)
    np.testing.assert_array_equal(got_q, np.clip(expected + zp_y, -128, 127))
    assert np.max(np.abs(got - ref)) <= S_Y * 1.0001  # the float mean, quantized: one step at most
    assert np.mean(got == ref) > 0.95


def _masked_softmax(k: float, expand: bool = False):
    """``Q(Softmax(DQ(Q(scores)) + (1 - mask) * k))`` with the mask broadcast over queries (or expanded to
    ``[B, 1, S, S]`` first, as Hugging Face's extended masks are)."""
    g = G()
    scores = g.qdq(g.input("s", [2, 1, 4, 4]), 0.05)
    m = g.node("Cast", [g.input("mask", [2, 4], TensorProto.INT64)], to=TensorProto.FLOAT)
    m = g.node("Unsqueeze", [m, g.const([1, 2], np.int64)])
    if expand:
        m = g.node("Expand", [m, g.const([2, 1, 4, 4], np.int64)])
    add = g.node("Mul", [g.node("Sub", [g.const(1.0), m]), g.const(k)])
    g.output(g.qdq(g.node("Softmax", [g.node("Add", [scores, add])], axis=-1), 1 / 256, 0, np.uint8))
    return g.model()


def test_small_additive_mask_is_refused_with_a_reason():
    """``(1 - mask) * -1``: the float softmax still gives masked keys weight, so it is not a mask."""
    with pytest.raises(ConversionError, match="do not mask the softmax"):
        rewrite(_masked_softmax(-1.0))


@pytest.mark.parametrize("k, expand", [(-10000.0, False), (float(np.finfo(np.float32).min), True)])
def test_large_additive_mask_gives_exact_zeros(k, expand):
    """The same graph with -10000 (or finfo.min, expanded): strict, masked keys' probabilities exactly 0."""
    fq = _masked_softmax(k, expand)
    model, _ = rewrite(fq)
    assert float_offenders(model) == []
    rng = np.random.default_rng(1)
    feeds = {"s": (rng.integers(-127, 128, (2, 1, 4, 4)) * 0.05).astype(np.float32)}
    feeds["mask"] = np.array([[1, 1, 0, 0], [1, 0, 1, 0]], np.int64)
    (got,), (ref,) = run(model, feeds), run(fq, feeds)
    assert np.all(got.transpose(0, 3, 1, 2)[feeds["mask"] == 0] == 0)
    assert np.all(ref.transpose(0, 3, 1, 2)[feeds["mask"] == 0] == 0)
    assert np.max(np.abs(got - ref)) <= 6 / 256  # Shiftmax vs softmax: <= 2.8 steps of 2**-7 (opset README)
