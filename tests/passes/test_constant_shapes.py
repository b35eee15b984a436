"""Every constant-folding path of the converter with constants of every small shape: 0-d scalars, one-element
tensors, broadcast rows and full tensors.

Exporters and quantizers put such constants everywhere (HF Swin's scalar scale, onnxruntime quantizing a 0-d
``Mul`` operand): each path must fold them with their shape kept, and the integer graph must equal the
fake-quant one within one output step. The paths: a QuantizeLinear of a float constant (``normalize``), a
``Constant`` node (``normalize``), Brevitas' Clip of the quantized constant (``normalize``), QONNX ``Quant``
of a constant (``qonnx_quant``), an initializer QuantizeLinear folded at load (``io.fold_quantized_weights``),
a constant computed by a small subgraph (``rules.consts``) and a plain float constant operand
(``Lowerer.operand``).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from ivit_onnx import Pipeline, rewrite
from ivit_onnx.certify import float_offenders
from tests.graphs import G, run
from tests.passes._rules import X

SHAPES = {"scalar": (), "one": (1,), "row": (1, 1, 16), "full": (6, 16)}
SCALE = 0.05


def _value(shape, positive: bool) -> np.ndarray:
    v = np.random.default_rng(len(shape)).uniform(0.5, 2.0, shape)
    return (v if positive else v * np.where(np.arange(v.size).reshape(shape) % 2, 1, -1)).astype(np.float32)


def _q_const(g: G, v: np.ndarray) -> str:
    """Float constant → QuantizeLinear (no zero point: int8 from opset 21's default, uint8 before; so not
    folded at load) → DequantizeLinear, as quantizers write the Q/DQ of an activation that is a constant."""
    s = g.const(float(np.abs(v).max()) / 255)
    return g.node("DequantizeLinear", [g.node("QuantizeLinear", [g.const(np.abs(v)), s]), s])


def _constant_node(g: G, v: np.ndarray) -> str:
    """A ``Constant`` node's value, quantized."""
    c = g.node("Constant", [], value=numpy_helper.from_array(v))
    return g.qdq(c, float(np.abs(v).max()) / 127)


def _clipped(g: G, v: np.ndarray) -> str:
    """Brevitas' QCDQ: QuantizeLinear → Clip(-127, 127) → DequantizeLinear."""
    s, z = g.const(float(np.abs(v).max()) / 127), g.const(0, np.int8)
    q = g.node("QuantizeLinear", [g.const(v), s, z])
    c = g.node("Clip", [q, g.const(-127, np.int8), g.const(127, np.int8)])
    return g.node("DequantizeLinear", [c, s, z])


def _qonnx(g: G, v: np.ndarray) -> str:
    """QONNX ``Quant`` (scale, zero point, bit width as constants) of a float constant."""
    ins = [g.const(v), g.const(float(np.abs(v).max()) / 127), g.const(0.0), g.const(8.0)]
    return g.node("Quant", ins, domain="qonnx.custom_op.general", signed=1, narrow=1, rounding_mode="ROUND")


def _init_q(g: G, v: np.ndarray) -> str:
    """An initializer QuantizeLinear with a 0-d scale and zero point (folded while loading)."""
    s, z = g.const(float(np.abs(v).max()) / 127), g.const(0, np.int8)
    return g.node("DequantizeLinear", [g.node("QuantizeLinear", [g.const(v), s, z]), s, z])


def _subgraph(g: G, v: np.ndarray) -> str:
    """A float constant reshaped by a small subgraph (Reshape of a Constant, as exporters write masks)."""
    flat = g.const(v.reshape(-1))
    shape = g.const(np.array(v.shape, np.int64), np.int64)
    return g.node("Reshape", [flat, shape])


def _plain(g: G, v: np.ndarray) -> str:
    return g.const(v)


PATHS = {
    "q_const": _q_const,
    "constant_node": _constant_node,
    "clip": _clipped,
    "qonnx": _qonnx,
    "init_q": _init_q,
    "subgraph": _subgraph,
    "plain": _plain,
}


def _model(path: str, shape, op: str):
    """``Q/DQ(x) <op> k`` → Q/DQ, ``k`` built by ``path`` with ``shape``."""
    g = G()
    x = g.qdq(g.input("x", list(X.shape)), SCALE)
    k = PATHS[path](g, _value(shape, positive=op in ("Mul", "Div")))
    y = g.node(op, [x, k] if op != "Add" else [k, x])
    g.output(g.qdq(y, SCALE * (4 if op != "Div" else 2)), list(X.shape))
    return g.model()


@pytest.mark.parametrize("op", ["Mul", "Add", "Div"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("path", PATHS)
def test_constant_operand_of_every_shape(path, shape, op):
    """Converted strictly, output within one step of the fake-quant model, output shape unchanged."""
    m = _model(path, SHAPES[shape], op)
    out, _ = rewrite(m)
    assert float_offenders(out) == []
    ref = m if path != "qonnx" else Pipeline.default().run(m, stop_after="normalize")[0]  # QONNX as Q/DQ
    got, want = run(out, {"x": X})[0], run(ref, {"x": X})[0]
    assert got.shape == X.shape
    assert np.max(np.abs(got.astype(np.float64) - want)) <= SCALE * 4 * 1.001


@pytest.mark.parametrize("shape", SHAPES)
def test_quantized_scalar_constant_keeps_its_shape(shape):
    """The folded QuantizeLinear of a constant is an integer tensor of the constant's own shape."""
    m = _model("q_const", SHAPES[shape], "Mul")
    out, report = Pipeline.default().run(m, stop_after="normalize")
    assert report.counts["normalize"]["QuantizeLinear of constant folded"] == 1
    folded = [t for t in out.graph.initializer if t.name.endswith("_q")]
    assert [list(t.dims) for t in folded] == [list(SHAPES[shape])]
    assert folded[0].data_type == TensorProto.UINT8
