"""The compile step's QGemm fusion (:mod:`ivit_onnx.engines.onnxruntime.qgemm_fold`): ``MatMulInteger ->
[bias Add] -> Requantize | RequantizeTable`` on tiny graphs, compiled by ``compile_model`` and run by the
library, equal to the reference evaluator on the graph as converted, on every instruction-set path; and the
pairs it must leave alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime import compile_model
from ivit_onnx.engines.onnxruntime.qgemm_fold import ENGINE_DOMAIN, fast_path, fold_qgemm
from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset.ort_library import native_library
from ivit_onnx.opset.reference import evaluator

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
K, N = 37, 21


def gemm_model(rng, adt, *, bias=True, per_column=True, table=False, wide_bias=False, out_acc=False):
    """``a -> MatMulInteger(w) -> [Add(bias)] -> Requantize(int8) [-> Requantize(int16)] -> y``."""
    info = np.iinfo(adt)
    size = N if per_column else 1
    inits = {
        "za": adt(rng.integers(info.min, info.max + 1)),
        "w": rng.integers(-128, 128, (K, N)).astype(np.int8),
        "zw": rng.integers(-3, 4, size).astype(np.int8).reshape(N if per_column else ()),
        "zx": np.int32(rng.integers(-1000, 1000)),
        "b": rng.integers(1 << 10, 1 << 14, size).astype(np.int64),
        "c": rng.integers(16, 24, size).astype(np.int64),
        "zy": np.int8(rng.integers(-10, 10)),
    }
    nodes = [helper.make_node("MatMulInteger", ["a", "w", "za", "zw"], ["acc"], name="gemm")]
    x = "acc"
    if bias:
        inits["bias"] = rng.integers(-(1 << 12), 1 << 12, N).astype(np.int32)
        if wide_bias:
            inits["bias"][0] = (1 << 31) - 1  # acc + bias could wrap: not folded
        nodes.append(helper.make_node("Add", ["acc", "bias"], ["acc_b"], name="add"))
        x = "acc_b"
    req = OPS["Requantize"].make_node([x, "zx", "b", "c", "zy"], ["q"], name="req", qmin=-127, qmax=127)
    nodes.append(req)
    out, out_type = "q", TensorProto.INT8
    if table:
        inits |= {"zq": np.int8(0), "bu": np.int64(-3), "cu": np.int64(1), "z16": np.int16(5)}
        nodes.append(OPS["Requantize"].make_node(["q", "zq", "bu", "cu", "z16"], ["y"], name="up",
                                                 qmin=-200, qmax=150))
        out, out_type = "y", TensorProto.INT16
    outputs = [helper.make_tensor_value_info(out, out_type, None)]
    if out_acc:
        outputs.append(helper.make_tensor_value_info("acc", TensorProto.INT32, None))
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("a", helper.np_dtype_to_tensor_dtype(np.dtype(adt)),
                                                      [2, 5, K])],
        outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    a = rng.integers(info.min, info.max + 1, (2, 5, K)).astype(adt)
    a[0, 0] = info.max  # the worst-case row
    return model, {"a": a}


def library_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.register_custom_ops_library(native_library())
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def fused_ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node if n.domain == ENGINE_DOMAIN]


@pytest.mark.skipif(not fast_path(), reason="no vector QGemm path here: the compile step keeps MatMulInteger")
@pytest.mark.parametrize("isa", ["portable", "avx2", "vnni", "amx", "neon", "dotprod", "i8mm", ""])
@pytest.mark.parametrize("u8_gemm", [True, False])
def test_fused_artifact_is_bit_exact(isa, u8_gemm, monkeypatch):
    from tests.opset.test_qgemm import ISAS, need

    if isa:
        need(isa)
        monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng([ISAS.get(isa, 0), int(u8_gemm)])
    for adt in (np.int8, np.uint8):
        for kw in ({}, {"per_column": False, "bias": False}, {"table": True}):
            model, feeds = gemm_model(rng, adt, **kw)
            compiled = compile_model(model, u8_gemm=u8_gemm)
            assert fused_ops(compiled.model) == ["QGemmTable" if kw.get("table") else "QGemm"]
            assert not [n for n in compiled.model.graph.node if n.op_type in ("MatMulInteger", "Add")]
            want = evaluator(model).run(None, feeds)
            got = library_run(compiled.model, feeds)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (adt, kw)


def test_left_alone():
    """A bias that could wrap int32, an accumulator the graph outputs, a kept one, non-constant weights."""
    rng = np.random.default_rng(5)
    model, _ = gemm_model(rng, np.uint8, wide_bias=True)
    assert fold_qgemm(model)[1] == 0
    model, _ = gemm_model(rng, np.uint8, out_acc=True)
    assert fold_qgemm(model)[1] == 0
    model, _ = gemm_model(rng, np.uint8, bias=False)
    assert fold_qgemm(model, keep={"acc"})[1] == 0
    w = next(t for t in model.graph.initializer if t.name == "w")
    model.graph.initializer.remove(w)
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.INT8, [K, N]))
    assert fold_qgemm(model)[1] == 0
