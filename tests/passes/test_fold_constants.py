"""fold_constants: input shapes fixed by the user, shape-derived subgraphs folded, the exporters' forms that a
symbolic batch keeps from folding simplified (the dynamo attention bias, adding zeros)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from ivit_onnx import ConversionError, Pipeline, rewrite
from ivit_onnx.passes.fold_constants import broadcast
from ivit_onnx.pipeline import Options
from tests.graphs import G, op_counts
from tests.passes._rules import RNG, X, lowered


def _folded(model, **options):
    out, report = Pipeline.default().run(model, Options(**options), stop_after="fold_constants")
    return out, report.counts.get("fold_constants", {})


def test_broadcast_of_symbolic_shapes():
    assert broadcast(["N", 4, 17, 17], [1, 1, 17, 1]) == ["N", 4, 17, 17]
    assert broadcast(["N", 1, 17, 17], [1]) == ["N", 1, 17, 17]
    assert broadcast(["N", 4], ["M", 4]) is None  # two symbols: undecided
    assert broadcast([None, 4], [1, 4]) is None


def _dynamo_bias(g: G, x: str, keep: np.ndarray) -> str:
    """The dynamo exporter's attention bias: ``Where(Expand(keep, [batch, 1, L, L]), 0, -max)``."""
    batch = g.node("Shape", [g.input("x_shape_src", ["N", 4, 6, 6])], start=0, end=1)
    target = g.node("Concat", [batch, g.const(np.array([1, 6, 6], np.int64), np.int64)], axis=0)
    mask = g.node("Expand", [g.const(keep, np.bool_), target])
    bias = g.node("Where", [mask, g.const(0.0), g.const(np.finfo(np.float32).min)])
    return g.node("Add", [x, bias])


def test_dynamo_attention_bias_of_all_true_folds_away():
    """With a symbolic batch the Expand cannot fold; it moves after the Where, is read unexpanded by the Add,
    and the all-zero bias then drops out."""
    g = G()
    x = g.qdq(g.input("x", ["N", 4, 6, 6]), 0.05)
    g.output(g.qdq(g.node("Softmax", [_dynamo_bias(g, x, np.ones((1, 1, 6, 1), bool))], axis=-1), 1 / 128))
    out, counts = _folded(g.model())
    assert counts["Expand moved after its constant operands"] == 1
    assert counts["Expand of a constant read unexpanded"] == 1
    assert counts["Add of zeros removed"] == 1
    assert not {"Where", "Expand", "Add"} & set(op_counts(out))
    x = X[:1, :6, :6].reshape(1, 1, 6, 6).repeat(4, 1)
    feeds = {"x": x, "x_shape_src": np.zeros((1, 4, 6, 6), np.float32)}
    lowered(g.model(), feeds, atol=3 / 128)  # Shiftmax is within 3 output steps of softmax


def test_shape_with_start_and_end_folds_to_its_range():
    """``Shape(x, start=1, end=3)`` folds to dims 1..2 (onnx-graphsurgeon 0.6 alone would fold the whole
    shape), so a Reshape target computed from it is right."""
    g = G()
    x = g.qdq(g.input("x", ["N", 6, 16]), 0.05)
    dims = g.node("Shape", [x], start=1, end=3)
    target = g.node("Concat", [g.const(np.array([-1], np.int64), np.int64), dims], axis=0)
    g.output(g.qdq(g.node("Reshape", [x, target]), 0.05))
    out, _ = _folded(g.model())
    shapes = [numpy_helper.to_array(t) for t in out.graph.initializer if t.data_type == TensorProto.INT64]
    assert any(np.array_equal(s, [-1, 6, 16]) for s in shapes), shapes
    lowered(g.model(), {"x": X}, atol=1e-6)


def _swin_like(symbolic_width: bool):
    """A LayerNorm whose channel count comes from a ``view`` to a shape computed at run time (HF Swin)."""
    g = G()
    x = g.qdq(g.input("x", ["N", 6, "W" if symbolic_width else 16]), 0.05)
    shape = g.node("Shape", [x])
    ranges = ((0, 2, 0), (2, 3, 0))  # dims [0:2] and [2:3] along axis 0
    parts = [g.node("Slice", [shape, *(g.const([k], np.int64) for k in r)]) for r in ranges]
    target = g.node("Concat", parts, axis=0)
    y = g.node("Reshape", [g.node("Transpose", [x], perm=[0, 1, 2]), target])
    ln = g.node("LayerNormalization", [y, g.const(np.ones(16)), g.const(np.zeros(16))], axis=-1)
    g.output(g.qdq(ln, 0.05))
    return g.model()


def test_input_shape_makes_the_channel_count_known():
    with pytest.raises(ConversionError, match="the channel count is unknown"):
        Pipeline.default().run(_swin_like(True))
    lowered(_swin_like(True), {"x": X}, atol=0.05 * 2, input_shapes={"x": ["N", 6, 16]})


@pytest.mark.parametrize(
    "shapes, message",
    [
        ({"y": [2, 6, 16]}, "--shape y: the model has no input of that name (inputs: x)"),
        ({"x": [2, 6]}, "--shape x: [2, 6] does not fit the input's shape [?,6,?]"),
        ({"x": [2, 7, 16]}, "--shape x: [2, 7, 16] does not fit the input's shape [?,6,?]"),
    ],
)
def test_input_shape_errors_name_the_input(shapes, message):
    with pytest.raises(ConversionError) as e:
        Pipeline.default().run(_swin_like(True), Options(input_shapes=shapes))
    assert str(e.value) == message


def _position_bias_mlp(g: G, final_qdq: bool) -> str:
    """Swinv2's continuous position bias: a small MLP with Q/DQ'd weights and activations over a constant
    coordinate table, then ``16 * sigmoid(...)`` (quantized once more when ``final_qdq``)."""
    table = g.const(RNG.uniform(-1, 1, (6, 2)))
    h = g.qdq(g.node("MatMul", [table, g.weight(RNG.standard_normal((2, 8)), axis=1)]), 0.02)
    h = g.node("MatMul", [g.node("Relu", [h]), g.weight(RNG.standard_normal((8, 16)) * 0.3, axis=1)])
    bias = g.node("Mul", [g.node("Sigmoid", [h]), g.const(16.0)])
    return g.qdq(bias, 16 / 255, 0, np.uint8) if final_qdq else bias


@pytest.mark.parametrize("final_qdq", [False, True])
def test_constant_subgraph_through_qdq_folds_as_the_fake_quant_model_computes_it(final_qdq):
    """The MLP folds to its fake-quant value; a final Q→DQ pair of it stays (a quantized constant for the
    Add), the weights of the GEMMs that read activations stay integers. Within one output step (the Add's
    requantize) of the fake-quant graph, integer-only."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05)
    y = g.node("Add", [x, _position_bias_mlp(g, final_qdq)])
    g.output(g.qdq(g.node("MatMul", [g.qdq(y, 0.1), g.weight(RNG.standard_normal((16, 4)), axis=1)]), 0.2))
    out, counts = _folded(g.model())
    ops = op_counts(out)
    assert counts["nodes folded through Q/DQ"] >= 5
    assert not {"Relu", "Sigmoid", "Mul"} & set(ops) and ops["MatMul"] == 1
    assert ops["QuantizeLinear"] == 3 + final_qdq  # x, y, the output (and the kept pair of the bias)
    assert ops["DequantizeLinear"] == 4 + final_qdq  # the same and the remaining weight
    lowered(g.model(), {"x": X}, atol=0.2 + 1e-6)


def test_weights_through_layout_ops_stay_integers():
    """A weight's integers → DequantizeLinear → Transpose are not computed: nothing folds there."""
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.05)
    w = g.node("Transpose", [g.weight(RNG.standard_normal((4, 16)), axis=0)], perm=[1, 0])
    g.output(g.qdq(g.node("MatMul", [x, w]), 0.2))
    out, counts = _folded(g.model())
    assert "nodes folded through Q/DQ" not in counts and op_counts(out)["Transpose"] == 1


def test_shape_arithmetic_through_qdq_folds():
    """MobileViT's ``ceil(h / p) * p`` with Q/DQ a quantizer put on the float shape arithmetic: with the shape
    fixed it is a constant Reshape target."""
    g = G()
    x = g.qdq(g.input("x", ["N", 6, 16]), 0.05)
    h = g.node("Cast", [g.node("Shape", [x], start=2, end=3)], to=TensorProto.FLOAT)
    c = g.node("Ceil", [g.qdq(g.node("Div", [h, g.const(8.0)]), 0.25)])
    target = g.node("Cast", [g.qdq(g.node("Mul", [c, g.const(8.0)]), 0.25)], to=TensorProto.INT64)
    target = g.node("Concat", [g.const([-1], np.int64), target], axis=0)
    g.output(g.qdq(g.node("Reshape", [x, target]), 0.05))
    out, counts = _folded(g.model(), input_shapes={"x": ["N", 6, 16]})
    assert counts["nodes folded through Q/DQ"] >= 4 and "Ceil" not in op_counts(out)
    shapes = [numpy_helper.to_array(t) for t in out.graph.initializer if t.data_type == TensorProto.INT64]
    assert any(np.array_equal(s, [-1, 16]) for s in shapes), shapes
    lowered(g.model(), {"x": X}, atol=1e-6)


def test_dimensions_behind_a_symbolic_batch_are_probed():
    """``Reshape(x, [batch, -1, 8])`` with a symbolic batch: ONNX inference cannot divide the size by the
    batch, so the token count is unknown and a mean over it cannot be lowered; inferring with the batch set to
    two numbers shows it is 8 whatever the batch (BEiT's and LeViT's TorchScript pooler)."""
    from tests.graphs import run

    g = G()
    x = g.qdq(g.input("x", ["N", 4, 16]), 0.05)
    batch = g.node("Unsqueeze", [g.node("Gather", [g.node("Shape", [x]), g.const(0, np.int64)]),
                                 g.const([0], np.int64)])
    target = g.node("Concat", [batch, g.const([-1, 8], np.int64)], axis=0)
    y = g.node("ReduceMean", [g.node("Reshape", [x, target])], axes=[1], keepdims=0)
    g.output(g.qdq(y, 0.05))
    fq = g.model()
    out, _ = rewrite(fq)
    assert "N" in str(out.graph.input[0].type.tensor_type.shape)  # the batch stays symbolic
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4, 16)).astype(np.float32)}
    assert np.max(np.abs(run(out, feeds)[0] - run(fq, feeds)[0])) <= 0.05 + 1e-6



def test_expanded_constant_moves_past_cast_and_its_quantize():
    """BEiT's dynamo export: ``Q(Cast(Expand(bool constant, shape of x)))`` with a symbolic batch. The Expand
    moves after the Cast and the per-tensor QuantizeLinear, which then fold: no float tensor is left."""
    from tests.graphs import run

    g = G()
    x = g.qdq(g.input("x", ["N", 4]), 0.05)
    wide = g.node("Expand", [g.const([[True, False, True, True]], np.bool_), g.node("Shape", [x])])
    bias = g.qdq(g.node("Cast", [wide], to=TensorProto.FLOAT), 1 / 127)
    g.output(g.qdq(g.node("Add", [x, bias]), 0.05))
    fq = g.model()
    out, report = rewrite(fq)
    assert report.counts["fold_constants"].get("Expand moved after its constant operands", 0) >= 2
    feeds = {"x": np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)}
    assert np.max(np.abs(run(out, feeds)[0] - run(fq, feeds)[0])) <= 0.05 + 1e-6


@pytest.mark.parametrize("shapes", [None, {"x": [2, 8, 16]}])
def test_float_arithmetic_on_shapes_keeps_its_fractions(shapes):
    """``int(8 * 0.75)`` is 6: onnx-graphsurgeon's cast elision (for TensorRT) would compute ``8 * int(0.75)``
    = 0 for ``Cast(int→float) → Mul(0.75) → Cast(→int)``; the guard keeps the float Mul, folded or not."""
    g = G()
    xq = g.qdq(g.input("x", ["N", 8, 16]), 0.05, 0)
    n = g.node("Gather", [g.node("Shape", [xq]), g.const(1, np.int64)])
    k = g.node("Mul", [g.node("Cast", [n], to=TensorProto.FLOAT), g.const(np.float32(0.75))])
    end = g.node("Unsqueeze", [g.node("Cast", [k], to=TensorProto.INT64), g.const([0], np.int64)])
    g.output(g.qdq(g.node("Slice", [xq, g.const([0], np.int64), end, g.const([1], np.int64)]), 0.05, 0))
    x = RNG.standard_normal((2, 8, 16)).astype(np.float32)
    out, _ = lowered(g.model(), {"x": x}, 1e-6, input_shapes=shapes)
    from tests.graphs import run

    assert run(out, {"x": x})[0].shape == (2, 6, 16)
