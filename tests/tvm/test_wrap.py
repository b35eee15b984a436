"""TVM compiles integer add/sub/mul as non-wrapping (LLVM nsw/nuw): the bodies' floor shift must not wrap
(it biases by 2**62 in int64, within its precondition ``|t| < 2**62``), and unsigned arithmetic is refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ivit_onnx.engines.tvm import prepare_for_tvm
from ivit_onnx.engines.tvm.wrap import rewrite_biased_shifts
from ivit_onnx.opset._body import Body

pytestmark = pytest.mark.tvm

T = np.array([-2**62, -2**40, -17, -16, -1, 0, 1, 15, 2**40 + 5, 2**62 - 1], np.int64)  # |t| < 2**62


def _floor_shift_model(shift: int) -> onnx.ModelProto:
    """``Body.floor_shift`` of an int64 input by a constant, as the function bodies build it."""
    body = Body(17)
    body.floor_shift("t", body.const(shift))
    body.nodes[-1].output[0] = "y"
    t, y = (helper.make_tensor_value_info(n, TensorProto.INT64, T.shape) for n in ("t", "y"))
    graph = helper.make_graph(body.nodes, "g", [t], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_floor_shift_has_no_wrapping_arithmetic():
    model = _floor_shift_model(4)
    np.testing.assert_array_equal(ReferenceEvaluator(model).run(None, {"t": T})[0], T >> 4)
    assert rewrite_biased_shifts(model) == 0  # nothing to rewrite: no uint64 Add/Sub in the bodies
    prepare_for_tvm(model)  # and nothing that TVM would compile as non-wrapping


@pytest.mark.parametrize("shift", [0, 1, 4, 31, 62])
def test_biased_shift_bitexact_in_tvm(shift):
    pytest.importorskip("tvm")
    from ivit_onnx.engines.tvm import compile_model

    out = compile_model(_floor_shift_model(shift)).run([T])[0]
    np.testing.assert_array_equal(out, T >> shift)


def test_other_unsigned_arithmetic_is_refused():
    g = helper.make_graph([helper.make_node("Add", ["u", "k"], ["y"], name="wraps")], "g",
                          [helper.make_tensor_value_info("u", TensorProto.UINT64, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT64, [3])],
                          initializer=[numpy_helper.from_array(np.uint64(1 << 63), "k")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(ValueError, match=r"wraps \(Add\)"):
        prepare_for_tvm(model)
