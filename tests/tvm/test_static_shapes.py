"""Shape arithmetic folded at the build's input shapes (``engines/tvm/static_shapes.py``): the class-token
``Expand`` of a torch export quantized by onnxruntime (#29) reaches an IAdd kernel with a static shape and
compiles bit-exactly; a shape relax still cannot know is refused in one line naming the node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _tvm_cases import GENERATORS, one_node_model
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ivit_onnx.engines.tvm import prepare_for_tvm
from ivit_onnx.opset.reference import evaluator

pytestmark = pytest.mark.tvm
SHAPE = [2, 4, 16]


def _token_model(shape_input: bool = False) -> tuple[onnx.ModelProto, dict]:
    """IAdd over Concat(Expand(token, shape), a) on axis 1, ``a`` of symbolic batch. The Expand's shape is
    the torch exporter's ``Where(Equal(s, -1), 1, s)`` with ``s = [batch of a, 1, 16]`` (or, with
    ``shape_input``, a graph input: only known at run time)."""
    rng = np.random.default_rng(3)
    inputs, attrs = GENERATORS["IAdd"](rng, tuple(SHAPE))
    model = one_node_model("IAdd", inputs, attrs)
    g = model.graph
    iadd = g.node[0]
    a = g.input[0]
    a.type.tensor_type.shape.dim[0].dim_param = "N"
    a.type.tensor_type.shape.dim[0].ClearField("dim_value")
    token = inputs[0][:1, :1]
    g.initializer.extend([numpy_helper.from_array(token, "token"),
                          numpy_helper.from_array(np.array([0], np.int64), "zero"),
                          numpy_helper.from_array(np.array([1, SHAPE[-1]], np.int64), "rest"),
                          numpy_helper.from_array(np.array(-1, np.int64), "minus_one"),
                          numpy_helper.from_array(np.ones(3, np.int64), "ones")])
    nodes = [helper.make_node("Shape", [a.name], ["shape_a"], name="shape"),
             helper.make_node("Gather", ["shape_a", "zero"], ["batch"], name="batch", axis=0),
             helper.make_node("Concat", ["batch", "rest"], ["s"], name="s", axis=0),
             helper.make_node("Equal", ["s", "minus_one"], ["is_any"], name="equal"),
             helper.make_node("Where", ["is_any", "ones", "s"], ["target"], name="where")]
    if shape_input:
        nodes = []
        g.input.append(helper.make_tensor_value_info("target", TensorProto.INT64, [3]))
    nodes += [helper.make_node("Expand", ["token", "target"], ["tokens"], name="expand"),
              helper.make_node("Concat", ["tokens", a.name], ["joined"], name="join", axis=1)]
    iadd.input[0] = "joined"
    g.node.extend(nodes)
    g.node.append(g.node.pop(0))  # the IAdd last
    del g.output[0].type.tensor_type.shape.dim[:]
    feeds = {a.name: inputs[0]}
    if shape_input:
        feeds["target"] = np.array(SHAPE[:1] + [1, SHAPE[-1]], np.int64)
    onnx.checker.check_model(model)
    return model, feeds


def test_shape_arithmetic_is_folded_at_the_fixed_shape():
    model, feeds = _token_model()
    prepared = prepare_for_tvm(model, shapes={"a": SHAPE})
    names = {n.name for n in prepared.graph.node}
    assert not {"shape", "batch", "s", "equal", "where", "expand"} & names, names
    tokens = {t.name: numpy_helper.to_array(t) for t in prepared.graph.initializer}["tokens"]
    assert list(tokens.shape) == [SHAPE[0], 1, SHAPE[-1]]  # the expanded token, a constant of the build
    want = evaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(ReferenceEvaluator(prepared).run(None, feeds)[0], want)
    assert len(model.graph.node) == 8  # the input is left alone


def test_folded_token_model_compiles_bit_exact():
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model

    model, feeds = _token_model()
    art = compile_model(model, shape={"a": SHAPE})
    np.testing.assert_array_equal(art.run(feeds)[0], evaluator(model).run(None, feeds)[0])


def test_shape_known_only_at_run_time_is_refused_naming_the_node():
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model

    model, _ = _token_model(shape_input=True)
    with pytest.raises(Exception) as e:
        compile_model(model, shape={"a": SHAPE})
    message = str(e.value)
    assert "\n" not in message and "IAdd 'n0'" in message and "--shape" in message, message
