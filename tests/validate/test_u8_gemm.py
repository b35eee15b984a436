"""The uint8 re-encoding of GEMM operands (:mod:`ivit_onnx.engines.onnxruntime.u8_gemm`) changes no output
and no intermediate."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime.u8_gemm import decode, recode
from ivit_onnx.opset.functions import attach_functions
from ivit_onnx.runners import OrtRunner, node_outputs
from tests.validate.conftest import x_batch


def _types(model: onnx.ModelProto) -> dict[str, int]:
    g = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}


def test_every_gemm_activation_becomes_uint8_and_outputs_stay(tiny):
    model = tiny.model()
    done = recode(model)
    types = _types(done.model)
    gemms = [n for n in done.model.graph.node if n.op_type == "MatMulInteger"]
    assert gemms and all(types[n.input[0]] == TensorProto.UINT8 for n in gemms)
    assert len(done.producers) >= 2 * 5  # per block: LN1, qkv, attention output, LN2, GELU
    x = x_batch(4)
    want = OrtRunner(model, "functions", 1).run({"input": x})
    # through the library: its self-check picks exact kernels for these uint8 GEMMs on this CPU (stock
    # onnxruntime's uint8 x int8 saturates without VNNI)
    got = OrtRunner(done.model, "library", 1).run({"input": x})
    assert all(np.array_equal(want[k], got[k]) for k in want)


def test_library_runner_decodes_every_intermediate(tiny):
    """Every node output of the re-encoded library session, decoded, equals the unmodified graph's."""
    model = tiny.model()
    lib, bodies = OrtRunner(model, "library", 1), OrtRunner(model, "functions", 1, u8_gemm=False)
    names = node_outputs(model)
    x = x_batch(2, seed=3)
    got, want = lib.run_with({"input": x}, names), bodies.run_with({"input": x}, names)
    assert lib.engine.compiled.recoded and set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    plain = OrtRunner(model, "library", 1, u8_gemm=False)
    compiled = plain.engine.compiled
    assert not compiled.recoded and compiled.counts["patch_gemm"] == 1  # the patch GEMM, on int8 operands


def _chain(consumer: str) -> onnx.ModelProto:
    """x:int8 -> Requantize -> t -> MatMulInteger(t, w), and t also into ``consumer`` (a blocker or not)."""
    i8 = lambda v, n: numpy_helper.from_array(np.array(v, np.int8), n)  # noqa: E731
    inits = [i8(0, "z"), numpy_helper.from_array(np.int64(3), "b"), numpy_helper.from_array(np.int64(1), "c"),
             i8(np.arange(12).reshape(4, 3) - 6, "w")]
    nodes = [helper.make_node("Requantize", ["x", "z", "b", "c", "z"], ["t"], domain="ai.ivit", qmin=-128,
                              qmax=127),
             helper.make_node("MatMulInteger", ["t", "w"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT32, None)]
    if consumer == "output":
        outputs.append(helper.make_tensor_value_info("t", TensorProto.INT8, None))
    elif consumer == "ILayerNorm":
        inits += [numpy_helper.from_array(np.full(4, 1 << 10, np.int64), n) for n in ("lb", "lbias")]
        inits.append(numpy_helper.from_array(np.full(4, 20, np.int64), "lc"))
        nodes.append(helper.make_node("ILayerNorm", ["t", "lb", "lc", "lbias", "z"], ["l"], domain="ai.ivit",
                                      shift_in=4, p=20, qmin=-128, qmax=127))
        outputs.append(helper.make_tensor_value_info("l", TensorProto.INT8, None))
    elif consumer == "Requantize":
        nodes.append(helper.make_node("Requantize", ["t", "z", "b", "c", "z"], ["r"], domain="ai.ivit",
                                      qmin=-128, qmax=127))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.INT8, None))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 4])],
                          outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)],
                          ir_version=10)
    return attach_functions(m)


def test_blockers_leave_the_producer_alone():
    for consumer, recoded in (("output", False), ("ILayerNorm", False), ("Requantize", True)):
        model = _chain(consumer)
        done = recode(model)
        assert bool(done.tensors) == recoded, consumer
        x = {"x": np.array([[-128, -1, 0, 127], [5, -7, 100, -100]], np.int8)}
        want = OrtRunner(model, "functions", 1, u8_gemm=False).run(x)
        got = OrtRunner(model, "library", 1).run(x)
        assert all(np.array_equal(want[k], got[k]) and want[k].dtype == got[k].dtype for k in want), consumer


def test_decode_is_the_inverse_of_plus_128():
    i = np.arange(-128, 128, dtype=np.int8)
    u = (i.astype(np.int16) + 128).astype(np.uint8)
    assert np.array_equal(decode("t", u, {"t"}), i)
    assert decode("t", u, set()) is u


def test_validate_reports_the_encoding_and_int8_gemm_turns_it_off(tiny, capsys):
    from tests.validate.test_validate_cli import run_main, status

    code, out, _ = run_main(capsys, tiny.int, "--backends", "library,functions")
    assert code == 0 and status(out, "bit-exact: functions == library") == "PASSED"
    assert "int8 GEMM operand producers re-encoded as uint8 (exact)" in out
    code, out, _ = run_main(capsys, tiny.int, "--backends", "library,functions", "--int8-gemm")
    assert code == 0 and "int8 GEMMs as converted" in out


def test_ablation_softmax_outputs_are_re_encoded_exactly():
    """An int8 IBertSoftmax / LogIntSoftmax feeding P·V writes ``p + 128`` as uint8 like Shiftmax (zero point
    moved, no clip to move), and the GEMM's output is unchanged."""
    from ivit_onnx.opset import OPS
    from tests.opset.oneop import poly_softmax_params

    rng = np.random.default_rng(5)
    attrs = poly_softmax_params(0.02, 16, 7)
    for op, extra in (("IBertSoftmax", {}), ("LogIntSoftmax", {"log_bits": 4})):
        nodes = [OPS[op].make_node(["s", "zp"], ["p"], name="softmax", **attrs, **extra),
                 OPS["Requantize"].make_node(["v", "zp32", "b", "c", "zp"], ["v8"], name="v8", qmin=-128,
                                             qmax=127),  # V from a producer that is re-encoded too
                 helper.make_node("MatMulInteger", ["p", "v8"], ["o"], name="pv")]
        inits = {"zp": np.int8(0), "zp32": np.int32(0), "b": np.int64(1), "c": np.int64(4)}
        graph = helper.make_graph(
            nodes, "pv", [helper.make_tensor_value_info("s", TensorProto.INT32, [2, 16, 16]),
                          helper.make_tensor_value_info("v", TensorProto.INT32, [2, 16, 8])],
            [helper.make_tensor_value_info("o", TensorProto.INT32, [2, 16, 8])],
            initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
        model = attach_functions(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                                   ir_version=10))
        done = recode(model)
        assert "softmax" in done.producers and _types(done.model)["p"] == TensorProto.UINT8
        feeds = {"s": rng.integers(-3000, 3000, (2, 16, 16)).astype(np.int32),
                 "v": rng.integers(-2048, 2048, (2, 16, 8)).astype(np.int32)}
        want = OrtRunner(model, "functions", 1).run(feeds)
        got = OrtRunner(done.model, "library", 1).run(feeds)
        assert all(np.array_equal(want[k], got[k]) for k in want)


def test_weights_holding_minus_128_become_uint8_and_outputs_stay():
    """uint8 x int8 meets -128 x -128 again on ARM cores without a dot product: such weights go uint8."""
    model = _chain("Requantize")
    w = next(t for t in model.graph.initializer if t.name == "w")
    w.CopyFrom(numpy_helper.from_array(np.array([[-128, 5, -128], [-128, -128, 7], [0, 1, 2], [-128, 3, 4]],
                                                np.int8), "w"))
    done = recode(model)
    gemm = next(n for n in done.model.graph.node if n.op_type == "MatMulInteger")
    inits = {t.name: numpy_helper.to_array(t) for t in done.model.graph.initializer}
    assert inits[gemm.input[1]].dtype == np.uint8 and int(inits[gemm.input[3]]) == 128
    assert np.array_equal(inits[gemm.input[1]].astype(np.int16) - 128, numpy_helper.to_array(w))
    x = {"x": np.array([[-128, -128, -128, -128], [5, -7, 100, -100]], np.int8)}
    want = OrtRunner(model, "functions", 1, u8_gemm=False).run(x)
    got = OrtRunner(model, "library", 1).run(x)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    plain = _chain("Requantize")  # weights in [-127, 127] stay int8
    gemm = next(n for n in recode(plain).model.graph.node if n.op_type == "MatMulInteger")
    assert gemm.input[1] == "w"
