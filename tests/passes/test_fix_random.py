"""fix_random (passes/fix_random.py): random numbers read only for their order (ViTMAE's patch shuffle) become
one fixed draw when the outputs do not depend on the draw, checked by drawing again; otherwise the
conversion stops naming the random op. Random numbers read as numbers stay refused (normalize)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ivit_onnx import ConversionError, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import G, op_counts, run
from tests.passes._rules import RNG

TOKENS, DIM = 6, 16
X = RNG.standard_normal((2, TOKENS, DIM)).astype(np.float32)


def _shuffled_mean(keep: int, op: str) -> onnx.ModelProto:
    """ViTMAE's embeddings in small: shuffle the tokens by the order of uniform noise, keep ``keep`` of them,
    then average them (a result independent of the order only when every token is kept). A ``*Like`` ``op``
    draws in the shape of a ConstantOfShape built from the input's shape (the exporters' form, symbolic
    batch), the others in a fixed shape."""
    like = op.endswith("Like")
    g = G(opset=18)
    x = g.qdq(g.input("x", ["N", TOKENS, DIM] if like else [2, TOKENS, DIM]), 0.05, 0)
    if like:
        batch = g.node("Slice", [g.node("Shape", [x]), g.const([0], np.int64), g.const([1], np.int64)])
        shape = g.node("Concat", [batch, g.const([TOKENS], np.int64)], axis=0)
        template = g.node("ConstantOfShape", [shape],
                          value=onnx.helper.make_tensor("value", onnx.TensorProto.FLOAT, [1], [1.0]))
        noise = g.node(op, [template])
    else:
        noise = g.node(op, [], shape=[2, TOKENS])
    _, order = g.node("TopK", [noise, g.const([TOKENS], np.int64)], n_out=2, axis=1, largest=0)
    kept = g.node("Slice", [order, g.const([0], np.int64), g.const([keep], np.int64), g.const([1], np.int64)])
    index = g.node("Expand", [g.node("Unsqueeze", [kept, g.const([2], np.int64)]),
                              g.const([1, 1, DIM], np.int64)])
    tokens = g.node("GatherElements", [x, index], axis=1)
    g.output(g.qdq(g.node("ReduceMean", [tokens, g.const([1], np.int64)], keepdims=0), 0.05, 0))
    return g.model()


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomNormalLike", "RandomUniform", "RandomNormal"])
def test_a_shuffle_the_outputs_ignore_is_fixed(op):
    """Every token kept: the mean does not depend on the order, so the shuffle becomes the identity; the
    result is integer-only and equals the fake-quant model's (which draws a new order each run) within one
    output step (float summation order)."""
    fq = _shuffled_mean(TOKENS, op)
    out, report = rewrite(fq)
    assert float_offenders(out) == []
    assert report.counts["fix_random"]["random order fixed"] == 1 and len(report.notes["fixed_random"]) == 1
    assert not any(op.startswith("Random") for op in op_counts(out))
    got, ref = run(out, {"x": X})[0], run(fq, {"x": X})[0]
    assert np.max(np.abs(got.astype(np.float64) - ref)) <= 0.05 + 1e-6


@pytest.mark.parametrize("op", ["RandomUniformLike", "RandomUniform"])
def test_a_shuffle_that_drops_tokens_is_refused(op):
    """Half the tokens kept: which half depends on the draw, so the check's fresh draws change the output."""
    with pytest.raises(ConversionError) as e:
        rewrite(_shuffled_mean(TOKENS // 2, op))
    msg = str(e.value)
    assert "Random" in msg and "depend on the random numbers" in msg and "\n" not in msg


def test_random_values_read_as_numbers_stay_refused():
    """Noise added to the activations is a value, not an order: normalize's refusal, naming the op."""
    g = G()
    x = g.qdq(g.input("x", [2, TOKENS, DIM]), 0.05, 0)
    g.output(g.qdq(g.node("Add", [x, g.node("RandomNormalLike", [x])]), 0.05, 0))
    with pytest.raises(ConversionError, match="RandomNormalLike '.*random numbers drawn at run time"):
        rewrite(g.model())
