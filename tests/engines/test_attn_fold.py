"""The compile step's attention fold (:mod:`ivit_onnx.engines.onnxruntime.attn_fold`): ``MatMulInteger`` of
two activations (Q·Kᵀ with its Transpose, P·V with its Requantize) on tiny graphs, compiled by
``compile_model`` and run by the library, equal to the reference evaluator on the graph as converted, on
every instruction-set path; and the GEMMs it must leave alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.engines.onnxruntime import compile_model
from ivit_onnx.engines.onnxruntime.attn_fold import fold_attention
from ivit_onnx.engines.onnxruntime.qgemm_fold import ENGINE_DOMAIN, fast_path
from ivit_onnx.opset import OPS, native_kernels
from ivit_onnx.opset.reference import evaluator
from tests.engines.test_qgemm_fold import library_run

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="the native library was not built")
B, H, T, D = 2, 3, 7, 5  # batch, heads, tokens, head size


def attention_model(
    rng, dt, *, table=False, scores_out=False, shared_t=False
) -> tuple[onnx.ModelProto, dict]:
    """``q, k, p, v -> MatMulInteger(q, Transpose(k)) -> y_s`` (int32, as RequantizeShiftmax reads it) and
    ``MatMulInteger(p, v) -> Requantize [-> Requantize (tabulated by chain_fold)] -> y_c``."""
    info = np.iinfo(dt)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
    inits = {
        "zq": dt(info.max),
        "zk": dt(rng.integers(info.min, info.max + 1)),
        "zv": dt(info.min),
        "zx": np.int32(rng.integers(-100, 100)),
        "b": np.int64(rng.integers(1 << 20, 1 << 22)),
        "c": np.int64(rng.integers(24, 30)),
        "zy": np.uint8(rng.integers(0, 256)),
    }
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
        helper.make_node("MatMulInteger", ["q", "kt", "zq", "zk"], ["y_s"], name="qk"),
        helper.make_node("MatMulInteger", ["p", "v", "", "zv"], ["acc"], name="pv"),
        OPS["Requantize"].make_node(["acc", "zx", "b", "c", "zy"], ["ctx"], name="req", qmin=0, qmax=255),
    ]
    out, out_type = "ctx", TensorProto.UINT8
    if table:
        inits |= {"zq2": np.uint8(0), "b2": np.int64(-3), "c2": np.int64(1), "z16": np.int16(5)}
        nodes.append(
            OPS["Requantize"].make_node(
                ["ctx", "zq2", "b2", "c2", "z16"], ["y16"], name="up", qmin=-200, qmax=150
            )
        )
        out, out_type = "y16", TensorProto.INT16
    outputs = [
        helper.make_tensor_value_info("y_s", TensorProto.INT32, None),
        helper.make_tensor_value_info(out, out_type, None),
    ]
    if scores_out:
        outputs.append(helper.make_tensor_value_info("acc", TensorProto.INT32, None))
    if shared_t:
        outputs.append(helper.make_tensor_value_info("kt", elem, None))
    shapes = {"q": [B, H, T, D], "k": [B, H, T, D], "p": [B, H, T, T], "v": [1, H, T, D]}  # v broadcast
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info(n, elem, s) for n, s in shapes.items()],
        outputs,
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)], ir_version=10
    )
    feeds = {n: rng.integers(info.min, info.max + 1, s).astype(dt) for n, s in shapes.items()}
    for x in feeds.values():
        x[rng.random(x.shape) < 0.3] = info.min
        x[rng.random(x.shape) < 0.3] = info.max
    return model, feeds


def engine_ops(model: onnx.ModelProto) -> list[str]:
    return sorted(n.op_type for n in model.graph.node if n.domain == ENGINE_DOMAIN)


@pytest.mark.skipif(not fast_path(), reason="no vector QGemm path here: the compile step keeps MatMulInteger")
@pytest.mark.parametrize("isa", ["portable", "avx2", "vnni", "amx", ""])
def test_folded_attention_is_bit_exact(isa, monkeypatch):
    from tests.opset.test_qgemm import ISAS, need

    if isa:
        need(isa)
        monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng(ISAS.get(isa, 0))
    for dt in (np.int8, np.uint8):
        for table in (False, True):
            for u8_gemm in (True, False):
                model, feeds = attention_model(rng, dt, table=table)
                compiled = compile_model(model, u8_gemm=u8_gemm)
                fused = "QBatchMatMulTable" if table else "QBatchMatMulRequantize"
                assert engine_ops(compiled.model) == sorted(["QBatchMatMul", fused])
                ops = [n.op_type for n in compiled.model.graph.node]
                assert "MatMulInteger" not in ops
                # B's Transpose is absorbed (trans_b); int8 graph inputs are read as they are (the fold runs
                # before u8_gemm's uint8 copies of what stays a MatMulInteger)
                assert ops.count("Transpose") == 0 and compiled.counts.get("u8_copy", 0) == 0
                assert compiled.counts["qbatch"] == 2
                assert "2 activation GEMMs (attention) as the library's QBatchMatMul" in compiled.describe()
                want = evaluator(model).run(None, feeds)
                got = library_run(compiled.model, feeds)
                assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (dt, table, u8_gemm)


def test_left_alone():
    """An accumulator the graph outputs keeps its Requantize, a Transpose read elsewhere stays, a constant
    operand (a weight: qgemm_fold's) or a zero point per row is not taken."""
    rng = np.random.default_rng(3)
    model, feeds = attention_model(rng, np.uint8, scores_out=True, shared_t=True)
    folded, count = fold_attention(model)
    assert count == 2
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("Transpose") == 1 and ops.count("Requantize") == 1
    assert sorted(n.op_type for n in folded.graph.node if n.domain == ENGINE_DOMAIN) == ["QBatchMatMul"] * 2
    if fast_path():
        want = evaluator(model).run(None, feeds)
        got = library_run(folded, feeds)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    model, _ = attention_model(rng, np.uint8)
    v = next(i for i in model.graph.input if i.name == "v")
    model.graph.input.remove(v)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((1, H, T, D), np.uint8), "v"))
    zq = next(t for t in model.graph.initializer if t.name == "zq")
    zq.CopyFrom(numpy_helper.from_array(np.zeros(T, np.uint8), "zq"))
    assert fold_attention(model)[1] == 0


def softmax_model(rng, up: int, length: int = 37, bits: int = 8,
                  after: bool = False) -> tuple[onnx.ModelProto, dict]:
    """``MatMulInteger(q, kᵀ) -> Requantize (int8) -> Requantize (× up, int32) -> Shiftmax -> p``: the
    converter's attention scores, which chain_fold turns into RequantizeShiftmax (its table decreasing where
    ``up`` < 0); ``after``: a Shiftmax of ``bits`` to int32, then a Requantize to uint8, as the converter
    writes ``quantize_static``'s (chain_fold: RequantizeShiftmaxTable)."""
    from ivit_onnx.opset.functions import attach_functions
    from tests.opset.oneop import shiftmax_params

    inits = {
        "zq": np.uint8(128), "zk": np.uint8(rng.integers(0, 256)),
        "zx": np.int32(rng.integers(-50, 50)), "b1": np.int64(rng.integers(1 << 10, 1 << 14)),
        "c1": np.int64(20), "zy": np.int8(rng.integers(-128, 64)),
        "z0": np.int8(0), "bu": np.int64(up), "cu": np.int64(0), "z32": np.int32(0), "sz": np.uint8(0),
    }
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMulInteger", ["q", "kt", "zq", "zk"], ["s"], name="qk"),
        OPS["Requantize"].make_node(["s", "zx", "b1", "c1", "zy"], ["r"], name="head", qmin=-128, qmax=127),
        OPS["Requantize"].make_node(["r", "z0", "bu", "cu", "z32"], ["v"], name="up", qmin=-(1 << 31),
                                    qmax=(1 << 31) - 1),
        OPS["Shiftmax"].make_node(["v", "sz"], ["p"], name="softmax",
                                  **shiftmax_params(1.0 / 500, length, bits)),
    ]
    if after:
        # y = s * 4 * 255 / 2**bits + 2, clipped: a row's larger probabilities reach the clip
        inits |= {"sz": np.int32(0), "pz": np.int32(0), "pb": np.int64(1020 << (30 - bits)),
                  "pc": np.int64(30), "py": np.uint8(2)}
        nodes[-1].output[0] = "s32"
        nodes.append(OPS["Requantize"].make_node(["s32", "pz", "pb", "pc", "py"], ["p"], name="after",
                                                 qmin=0, qmax=255))
    shapes = {"q": [B, H, length, D], "k": [B, H, length, D]}
    graph = helper.make_graph(
        nodes, "scores", [helper.make_tensor_value_info(n, TensorProto.UINT8, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info("p", TensorProto.UINT8, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.ivit", 1)], ir_version=10
    )
    feeds = {n: rng.integers(0, 256, s).astype(np.uint8) for n, s in shapes.items()}
    feeds["q"][0, 0, 0] = 128  # a constant row of scores
    return attach_functions(model), feeds


@pytest.mark.skipif(not fast_path(), reason="no vector QGemm path here: the compile step keeps MatMulInteger")
@pytest.mark.parametrize("isa", ["portable", "avx2", "vnni", "amx", "neon", "dotprod", "i8mm", ""])
def test_scores_shiftmax_fused(isa, monkeypatch):
    """Q·Kᵀ -> RequantizeShiftmax (chain_fold's) runs as one QBatchMatMulShiftmax where its table is
    non-decreasing, equal bit for bit to the graph as converted; a decreasing table keeps the two ops."""
    from tests.opset.test_qgemm import ISAS, need

    if isa:
        need(isa)
        monkeypatch.setenv("IVIT_GEMM_ISA", isa)
    rng = np.random.default_rng(ISAS.get(isa, 0) + 5)
    for up, length, fused in ((7, 37, True), (3, 197, True), (-5, 37, False)):
        model, feeds = softmax_model(rng, up, length)
        compiled = compile_model(model)
        want_ops = ["QBatchMatMulShiftmax"] if fused else ["QBatchMatMul"]
        assert engine_ops(compiled.model) == want_ops, up
        want = evaluator(model).run(None, feeds)
        got = library_run(compiled.model, feeds)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (up, length)
    for bits, length in ((16, 37), (12, 197)):  # quantize_static's: a Requantize after it, as a table
        model, feeds = softmax_model(rng, 7, length, bits=bits, after=True)
        compiled = compile_model(model)
        assert engine_ops(compiled.model) == ["QBatchMatMulShiftmaxTable"], bits
        want = evaluator(model).run(None, feeds)[0]
        got = library_run(compiled.model, feeds)[0]
        assert got.dtype == want.dtype == np.uint8 and np.array_equal(got, want), (bits, length)
        assert len(np.unique(want)) > 5
