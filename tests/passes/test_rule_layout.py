"""Rules for layout ops (passes/rules/layout.py): pass-through ops (Reshape, Transpose, Split, MaxPool, ...),
Concat, Shape and Cast run on the integers and give exactly the fake-quant values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from tests.graphs import G, op_counts
from tests.passes._rules import RNG, X, declines, lowered


@pytest.mark.parametrize(
    "op",
    ["Reshape", "Transpose", "Slice", "Gather", "Flatten", "Squeeze", "Expand", "Tile", "GatherElements",
     "ReverseSequence"],
)
def test_pass_through_ops_are_exact(op):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 4)
    args = {
        "Reshape": ([g.const([2, 96], np.int64)], {}),
        "Transpose": ([], {"perm": [2, 0, 1]}),
        "Slice": ([g.const([1], np.int64), g.const([5], np.int64), g.const([1], np.int64)], {}),
        "Gather": ([g.const(0, np.int64)], {"axis": 1}),
        "Flatten": ([], {"axis": 2}),
        "Squeeze": ([], {}),
        "Expand": ([g.const([3, 2, 6, 16], np.int64)], {}),
        "Tile": ([g.const([1, 2, 1], np.int64)], {}),
        # ViTMAE's un-shuffle: tokens gathered back by a permutation along the sequence
        "GatherElements": ([g.const(np.argsort(RNG.random((2, 6, 16)), axis=1), np.int64)], {"axis": 1}),
        "ReverseSequence": ([g.const([6, 3], np.int64)], {"batch_axis": 0, "time_axis": 1}),
    }[op]
    src = g.node("Unsqueeze", [x, g.const([0], np.int64)]) if op == "Squeeze" else x
    g.output(g.qdq(g.node(op, [src, *args[0]], **args[1]), 0.03, 4))
    out, _ = lowered(g.model(), {"x": X}, 1e-6)
    assert "QuantizeLinear" in op_counts(out) and "ai.ivit:Requantize" not in op_counts(out)


def test_split_gives_each_output_the_type():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    a, b = g.node("Split", [x, g.const([8, 8], np.int64)], n_out=2, axis=2)
    g.output(g.qdq(g.node("MatMul", [a, g.node("Transpose", [b], perm=[0, 2, 1])]), 0.05))
    out, _ = lowered(g.model(), {"x": X}, 0.05 + 1e-6)
    assert op_counts(out).get("Split") == 1 and op_counts(out).get("MatMulInteger") == 1


def test_maxpool_runs_on_the_integers():
    g = G()
    x = g.qdq(g.input("img", [1, 2, 6, 6]), 0.03, 7, np.uint8)
    g.output(g.qdq(g.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2]), 0.03, 7, np.uint8))
    out, _ = lowered(g.model(), {"img": RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)}, 1e-6)
    assert op_counts(out).get("MaxPool") == 1


@pytest.mark.parametrize("op, channels", [("DepthToSpace", 8), ("SpaceToDepth", 2)])
def test_depth_space_rearrangements_are_exact(op, channels):
    g = G()
    x = g.qdq(g.input("img", [1, channels, 4, 4]), 0.03, 7, np.uint8)
    g.output(g.qdq(g.node(op, [x], blocksize=2), 0.03, 7, np.uint8))
    img = RNG.standard_normal((1, channels, 4, 4)).astype(np.float32)
    out, _ = lowered(g.model(), {"img": img}, 1e-6)
    assert op_counts(out).get(op) == 1


def test_concat_of_a_token_and_a_sequence_takes_the_next_quantize_type():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    cls = g.const(RNG.standard_normal((2, 1, 16)) * 0.5)
    g.output(g.qdq(g.node("Concat", [cls, x], axis=1), 0.04))
    out, _ = lowered(g.model(), {"x": X}, 0.04 + 1e-6)
    assert op_counts(out).get("Concat") == 1


def test_shape_reads_the_integer_tensor_and_stays():
    """A Shape of a tensor with a symbolic batch stays (a static one folds into a constant)."""
    g = G()
    x = g.qdq(g.input("x", ["N", 6, 16]), 0.03)
    shape = g.node("Shape", [x])
    g.output(g.qdq(g.node("Reshape", [g.node("Transpose", [x], perm=[0, 2, 1]), shape]), 0.03))
    out, _ = lowered(g.model(), {"x": X}, 1e-6)
    assert op_counts(out).get("Shape") == 1


def test_float_cast_is_the_identity_on_the_integers():
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    g.output(g.qdq(g.node("Cast", [x], to=TensorProto.FLOAT), 0.03))
    out, report = lowered(g.model(), {"x": X}, 1e-6)
    assert "Cast" not in op_counts(out)


@pytest.mark.parametrize(
    "case, op, reason",
    [
        ("concat_float", "Concat", "no input is quantized"),
        ("concat_operand", "Concat", "input 'y' is not quantized nor a constant"),
        ("cast_int", "Cast", "a Cast of a quantized tensor to a non-float type"),
        ("reshape_float", "Reshape", "input 'f' is not quantized nor a constant"),
        ("wide", "DepthToSpace", "onnxruntime runs DepthToSpace on 8-bit integers only (input is int32)"),
    ],
)
def test_declines_with_the_reason(case, op, reason):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03)
    if case == "concat_float":
        y = g.node("Concat", [g.input("a", [2, 6, 16]), g.input("b", [2, 6, 16])], axis=1)
    elif case == "concat_operand":
        y = g.node("Concat", [x, g.input("y", [2, 6, 16])], axis=1)
    elif case == "wide":  # an int32 accumulator
        y = g.node("MatMul", [x, g.weight(RNG.standard_normal((16, 16)), axis=1)])
        y = g.node("DepthToSpace", [g.node("Reshape", [y, g.const([1, 4, 6, 8], np.int64)])], blocksize=2)
        y = g.node("Reshape", [y, g.const([2, 6, 16], np.int64)])
    elif case == "cast_int":
        y = g.node("Cast", [g.node("Cast", [x], to=TensorProto.INT32)], to=TensorProto.FLOAT)
    else:
        y = g.node("Reshape", [g.input("f", [2, 6, 16]), g.const([2, 96], np.int64)])
    g.output(g.qdq(y, 0.05))
    declines(g.model(), op, reason)


@pytest.mark.parametrize("op", ["Dropout", "Identity"])
def test_inference_identities_are_exact(op):
    g = G()
    x = g.qdq(g.input("x", [2, 6, 16]), 0.03, 4)
    g.output(g.qdq(g.node(op, [x]), 0.03, 4))
    out, _ = lowered(g.model(), {"x": X}, 1e-6)
    assert op not in op_counts(out)
