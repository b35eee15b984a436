"""Strict conversion and the integer-only certificate are one definition: a strict ``rewrite`` never returns
(or writes) a model that ``certify.float_offenders`` rejects, and input conversions in front of the input
quantize (Hugging Face's ``pixel_values.to(dtype)``) are removed or certified as the input itself."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from ivit_onnx import ConversionError, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import G, run

W = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)


def _linear(g: G, x: str) -> str:
    y = g.node("MatMul", [g.qdq(x, 0.05), g.weight(W, axis=1)])
    return g.qdq(y, 0.1)


def test_same_type_cast_before_the_input_quantize_is_removed():
    g = G()
    x = g.input("pixel_values", ["N", 4, 16])
    g.output(_linear(g, g.node("Cast", [x], to=TensorProto.FLOAT)))
    fq = g.model()
    out, report = rewrite(fq)
    assert float_offenders(out) == []
    assert report.counts["normalize"]["Cast to the same type removed"] == 1
    assert not [n for n in out.graph.node if n.op_type == "Cast" and n.input[0] == "pixel_values"]
    feeds = {"pixel_values": np.random.default_rng(0).standard_normal((2, 4, 16)).astype(np.float32)}
    assert np.max(np.abs(run(out, feeds)[0] - run(fq, feeds)[0])) <= 0.1 + 1e-6  # one output step


def test_float16_input_cast_to_float32_is_an_input_conversion():
    g = G()
    x = g.input("pixel_values", ["N", 4, 16], TensorProto.FLOAT16)
    g.output(_linear(g, g.node("Cast", [x], to=TensorProto.FLOAT)))
    out, _ = rewrite(g.model())
    assert float_offenders(out) == []  # the Cast reads the input and feeds only the input quantize


def test_float_op_left_beside_the_integer_path_fails_the_strict_rewrite(tmp_path):
    """A float Cast of the raw input that no lowering rule flags (it reads no quantized tensor) still makes
    the model fail the certificate: strict mode refuses it, names it, and writes nothing."""
    g = G()
    x = g.input("pixel_values", ["N", 4, 16])
    g.output(_linear(g, x))
    g.output(g.node("Cast", [x], to=TensorProto.FLOAT16))
    fq = g.model()
    out_path = tmp_path / "int.onnx"
    with pytest.raises(ConversionError) as e:
        rewrite(fq, out_path)
    message = str(e.value)
    assert "integer-only certificate" in message and "Cast '" in message and "\n" not in message
    assert not out_path.exists()
    out, report = rewrite(fq, allow_float=True)  # the documented way out still converts
    assert report is not None and float_offenders(out)
