"""prepare_for_tvm: private ops inlined, Constant attributes as tensors, no foreign domain left, ConvInteger
rewritten into forms TVM imports (onnx only: runs without TVM)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from _tvm_cases import GENERATORS, chain_model, one_node_model
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ivit_onnx.conv_gemm import rewrite_conv_integer
from ivit_onnx.engines.tvm import foreign_nodes, prepare_for_tvm
from ivit_onnx.opset import OPS

pytestmark = pytest.mark.tvm


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                yield from _all_nodes(sub)


@pytest.mark.parametrize("op", sorted(GENERATORS))
@pytest.mark.parametrize("opset", [17, 18])
def test_inlined_plain_and_equivalent(op, opset):
    rng = np.random.default_rng(1)
    inputs, attrs = GENERATORS[op](rng, (2, 3, 16))
    model = one_node_model(op, inputs, attrs, opset)
    prepared = prepare_for_tvm(model)
    assert not prepared.functions and not foreign_nodes(prepared.graph)
    assert {i.domain for i in prepared.opset_import} <= {"", "ai.onnx"}
    for node in _all_nodes(prepared.graph):
        assert node.domain in ("", "ai.onnx")
        if node.op_type == "Constant":
            assert [a.name for a in node.attribute] == ["value"]
    onnx.checker.check_model(prepared)  # not full_check: signed BitShift (arithmetic) is TVM-only
    x = {model.graph.input[0].name: inputs[0]}
    expected = OPS[op].run(*inputs, **attrs)
    np.testing.assert_array_equal(ReferenceEvaluator(prepared).run(None, x)[0], expected)
    assert len(model.functions) == 1  # the input is left alone


def test_unknown_domain_is_refused():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], domain="com.example", name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.INT32, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [2])])
    imports = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    m = helper.make_model(g, opset_imports=imports)
    with pytest.raises(ValueError, match="com.example.Relu"):
        prepare_for_tvm(m)


def test_chain_prepares():
    prepared = prepare_for_tvm(chain_model(np.random.default_rng(0)))
    ops = {n.op_type for n in prepared.graph.node}
    assert "MatMulInteger" in ops and not ops & {"Requantize", "IAdd", "Shiftmax", "ShiftGELU", "ILayerNorm"}


def conv_model(xdt, wdt, xshape, out_ch, kernel, zx=None, zw=None, seed=0, **attrs):
    """One ConvInteger node with constant weights (and zero points)."""
    rng = np.random.default_rng(seed)
    ch = xshape[1] // attrs.get("group", 1)
    w = rng.integers(np.iinfo(wdt).min, np.iinfo(wdt).max, (out_ch, ch, *kernel), endpoint=True).astype(wdt)
    inits, names = [numpy_helper.from_array(w, "w")], ["x", "w", "", ""]
    if zx is not None:
        inits.append(numpy_helper.from_array(np.asarray(zx, xdt), "zx"))
        names[2] = "zx"
    if zw is not None:
        inits.append(numpy_helper.from_array(np.asarray(zw, wdt), "zw"))
        names[3] = "zw"
    while not names[-1]:
        names.pop()
    x = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(xdt)), xshape)
    g = helper.make_graph([helper.make_node("ConvInteger", names, ["y"], name="conv", **attrs)], "g", [x],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


#: (x dtype, w dtype, x shape, out channels, kernel, x zero point, w zero point, attributes)
PATCH_CONVS = [
    (np.uint8, np.int8, (2, 3, 32, 32), 16, (8, 8), 128, None, {"strides": [8, 8]}),
    (np.int8, np.int8, (1, 3, 30, 30), 8, (4, 4), None, None, {"strides": [4, 4], "kernel_shape": [4, 4]}),
    (np.uint8, np.uint8, (1, 3, 30, 29), 8, (4, 4), 7, np.arange(8), {"strides": [4, 4]}),
]
GENERAL_CONVS = [
    (np.int8, np.uint8, (2, 4, 9, 9), 6, (3, 3), -5, 3, {"pads": [1, 1, 1, 1]}),
    (np.uint8, np.int8, (1, 4, 11, 10), 6, (3, 3), 100, np.arange(6) - 3,
     {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2], "group": 2}),
]


@pytest.mark.parametrize("case", PATCH_CONVS)
def test_patch_conv_becomes_matmulinteger(case):
    model = conv_model(*case[:7], **case[7])
    prepared = prepare_for_tvm(model)
    ops = [n.op_type for n in prepared.graph.node]
    assert "ConvInteger" not in ops and ops.count("MatMulInteger") == 1 and "Conv" not in ops
    rng = np.random.default_rng(2)
    x = rng.integers(np.iinfo(case[0]).min, np.iinfo(case[0]).max, case[2], endpoint=True).astype(case[0])
    np.testing.assert_array_equal(ReferenceEvaluator(prepared).run(None, {"x": x})[0],
                                  ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("case", GENERAL_CONVS)
def test_general_conv_becomes_int32_conv(case):
    model = conv_model(*case[:7], **case[7])
    assert rewrite_conv_integer(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert "ConvInteger" not in ops and ops.count("Conv") == 1
