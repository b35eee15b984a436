"""Rewrite time grows linearly with the model: no pass may be quadratic in the node count.

One block repeated 25 and 200 times (8x the nodes): each block computes a Reshape target from the symbolic
shape (what exporters do in every layer, folded by ``fold_constants`` once ``--shape`` fixes it), a GEMM, a
softmax and a residual add. Each pass's time at 200 blocks must stay within a linear bound of its time at 25
(linear growth is 8x; a quadratic pass takes 64x). The check came from ``fold_constants``: onnx-graphsurgeon's
partitioned folding copied the graph once per folded output (36x here; a 2-layer long-document encoder took
minutes); it now folds in one onnxruntime session unless that fails.
"""

from __future__ import annotations

import numpy as np

from ivit_onnx import rewrite
from tests.graphs import G

#: 8x the blocks: linear growth is 8x, quadratic 64x; this leaves room for timer noise
GROWTH = 20.0
#: a pass's time at 25 blocks counts as at least this (timer noise on a loaded 2-core machine)
FLOOR_S = 0.1


def _chain(blocks: int):
    rng = np.random.default_rng(0)
    g = G()
    h = g.qdq(g.input("x", ["N", 4, 16]), 0.05)
    for _ in range(blocks):
        batch = g.node("Gather", [g.node("Shape", [h]), g.const(0, np.int64)], axis=0)
        target = g.node("Concat", [g.node("Unsqueeze", [batch, g.const([0], np.int64)]),
                                   g.const([4, 16], np.int64)], axis=0)
        x = g.node("Reshape", [h, target])
        y = g.qdq(g.node("MatMul", [x, g.weight(rng.standard_normal((16, 16)) * 0.25, axis=1)]), 0.05)
        p = g.qdq(g.node("Softmax", [y], axis=-1), 1 / 256, 0, np.uint8)
        h = g.qdq(g.node("Add", [x, p]), 0.05)
    g.output(h)
    return g.model()


def _seconds(blocks: int, runs: int = 2) -> dict[str, float]:
    """Each pass's fastest time over ``runs`` conversions (a loaded machine's pauses are not the pass's)."""
    model, best = _chain(blocks), {}
    for _ in range(runs):
        _, report = rewrite(model, input_shapes={"x": [2, 4, 16]})
        best = {k: min(v, best.get(k, v)) for k, v in report.seconds.items()}
    return best


def test_no_pass_is_quadratic_in_the_node_count():
    _seconds(2, runs=1)  # warm-up: onnxruntime's and the rules' first-use costs
    small, large = _seconds(25), _seconds(200)
    slow = {
        name: (round(small[name], 3), round(large[name], 3))
        for name in small
        if large[name] > GROWTH * max(small[name], FLOOR_S)
    }
    assert not slow, f"passes growing faster than linearly (25 vs 200 blocks, seconds): {slow}"
    assert sum(small.values()) < 10, small  # seconds, not minutes
