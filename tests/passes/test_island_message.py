"""Strict mode's refusal is one line that counts every float island by op, names the first few with their
reasons, and suggests ``--shape`` only for islands that static shapes would fold away."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from ivit_onnx import ConversionError, rewrite
from tests.graphs import G, run


def _refusal(model, **options) -> str:
    with pytest.raises(ConversionError) as e:
        rewrite(model, **options)
    return str(e.value)


def test_many_islands_are_counted_by_op_on_one_line():
    g = G()
    h = g.qdq(g.input("x", ["N", 8]), 0.05)
    for _ in range(40):  # 40 islands: Pow of two activations has no integer meaning
        h = g.qdq(g.node("Pow", [h, h]), 0.05)
    g.output(h)
    message = _refusal(g.model())
    assert "\n" not in message
    assert message.startswith("40 node(s)") and "float islands: Pow ×40" in message
    assert message.count("Pow '") == 4 and "(36 more)" in message
    assert "--shape" not in message  # the input is symbolic, but fixing it removes none of these


def _shape_scaled(batch):
    """``x * sqrt(batch)``: the factor comes from the input's (symbolic) batch dimension only."""
    g = G()
    x = g.input("x", [batch, 8])
    n = g.node("Cast", [g.node("Gather", [g.node("Shape", [x]), g.const(0, np.int64)])], to=TensorProto.FLOAT)
    y = g.node("Mul", [g.qdq(x, 0.05), g.node("Sqrt", [n])])
    g.output(g.qdq(y, 0.1))
    return g.model()


def test_shape_hint_only_for_islands_computed_from_symbolic_shapes():
    message = _refusal(_shape_scaled("N"))
    assert "1 of them depend on symbolic input shapes (x: [?,8])" in message
    assert "--shape NAME=" in message
    # the advice is true: with the batch fixed the factor folds and the model converts strictly
    fq = _shape_scaled("N")
    out, _ = rewrite(fq, input_shapes={"x": [2, 8]})
    feeds = {"x": np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)}
    assert np.max(np.abs(run(out, feeds)[0] - run(fq, feeds)[0])) <= 0.1 + 1e-6


def test_infinite_scale_says_its_cause_and_what_to_do():
    """MPNet's position buckets take log(0) = -inf; a quantizer calibrated on it writes an infinite scale. The
    refusal names the op that makes the tensor and how to leave it unquantized."""
    g = G()
    x = g.input("x", ["N", 8])
    logs = g.node("Log", [g.node("Abs", [x])])
    g.output(g.qdq(logs, np.inf))
    message = _refusal(g.model())
    assert "\n" not in message and "is not finite" in message
    assert "Log '" in message and "nodes_to_exclude" in message and "ignored_scope" in message


def test_one_element_scales_become_scalars_so_islands_load_in_onnxruntime():
    """NNCF writes ``[1]``-shaped scales; an ``--allow-float`` island keeps its Q/DQ, which onnxruntime fuses
    into QLinear ops that take scalars only: the converted model's Q/DQ parameters are scalars."""
    from onnx import numpy_helper

    g = G()
    x = g.input("x", ["N", 8])
    s, z = g.const([0.05]), g.const([0], np.int8)
    dq = g.node("DequantizeLinear", [g.node("QuantizeLinear", [x, s, z]), s, z])
    y = g.node("Pow", [dq, dq])
    g.output(g.node("DequantizeLinear", [g.node("QuantizeLinear", [y, s, z]), s, z]))
    fq = g.model()
    out, _ = rewrite(fq, allow_float=True)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    for n in out.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert all(inits[t].ndim == 0 for t in n.input[1:] if t in inits), n.name
    feeds = {"x": np.linspace(0.5, 2, 16, dtype=np.float32).reshape(2, 8)}
    np.testing.assert_allclose(run(out, feeds)[0], run(fq, feeds)[0], atol=0.05 + 1e-6)


def test_random_numbers_are_refused_with_what_to_export():
    """ViTMAE's patch shuffle draws noise at run time: one line naming the op and what to export instead."""
    g = G()
    x = g.qdq(g.input("x", [2, 8]), 0.05)
    g.output(g.qdq(g.node("Add", [x, g.node("RandomUniformLike", [x])]), 0.05))
    message = _refusal(g.model())
    assert message.startswith("RandomUniformLike '") and "noise=" in message and "\n" not in message
