"""Producers taken into their consumers' kernels (``kernels.frontend._Import``), bit for bit: the attention
pattern ``Q·Kᵀ -> Requantize(int8) -> Requantize(int32) -> Shiftmax(uint8) -> P·V`` becomes a GEMM with an
int8 epilogue, one row kernel that recomputes the int32 scores and writes the probabilities' row sums, and a
uint8 P·V GEMM whose zero-point term uses those sums; equal to the
numpy reference and to the inlined bodies on llvm, and on cuda no GEMM writes int32 to global memory. Also the
row kernels' schedule: each cuda thread block computes its own row only (no per-row arrays)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.opset import OPS
from ivit_onnx.opset.functions import attach_functions
from ivit_onnx.opset.reference import evaluator

tvm = pytest.importorskip("tvm")
from _tvm_cases import chain_model  # noqa: E402

from ivit_onnx.engines.tvm import compile_model, prepare_for_tvm  # noqa: E402
from ivit_onnx.engines.tvm.compile import fuse, import_relax, io_specs, make_target  # noqa: E402
from ivit_onnx.engines.tvm.cuda import cuda_sources, to_ptx  # noqa: E402
from ivit_onnx.engines.tvm.kernels import KERNEL_OPS  # noqa: E402
from ivit_onnx.engines.tvm.proxies import kernels, measure  # noqa: E402

pytestmark = pytest.mark.tvm
SHAPE = [2, 2, 17, 64]  # batch, heads, tokens, head_dim: every GEMM extent >= 16 (int8 tensor cores)


def attention_model(
    probs_output: bool = False, a_zero_point: int | None = None, shape: tuple = tuple(SHAPE)
) -> onnx.ModelProto:
    """``softmax(Q·Kᵀ)·V`` as the rewriter emits it (scores requantized to int8, widened to int32 for
    Shiftmax, uint8 probabilities); with ``probs_output`` the probabilities are a graph output too."""
    i64 = np.int64
    c = {
        "i32_zp": np.int32(0),
        "i8_zp": np.int8(0),
        "u8_zp": np.uint8(0),
        "s_m": i64(1_300_000),
        "s_c": i64(33),
        "up_m": i64(5 << 20),
        "up_c": i64(16),
        "o_m": i64(1 << 22),
        "o_c": i64(30),
        "a_zp": np.uint8(a_zero_point or 0),
    }
    q = {"qmin": -128, "qmax": 127}
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMulInteger", ["q", "kt"], ["s"]),
        OPS["Requantize"].make_node(["s", "i32_zp", "s_m", "s_c", "i8_zp"], ["s8"], **q),
        OPS["Requantize"].make_node(
            ["s8", "i8_zp", "up_m", "up_c", "i32_zp"], ["s32"], qmin=-(2**31), qmax=2**31 - 1
        ),
        OPS["Shiftmax"].make_node(["s32", "u8_zp"], ["probs"], x0=1226, n=30, bits=8),
        helper.make_node(
            "MatMulInteger", ["probs", "v"] + (["a_zp"] if a_zero_point is not None else []), ["o"]
        ),
        OPS["Requantize"].make_node(["o", "i32_zp", "o_m", "o_c", "i8_zp"], ["y"], **q),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT8, list(shape)) for n in ("q", "k", "v")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT8, list(shape))]
    if probs_output:
        probs = list(shape[:3]) + [shape[2]]
        outputs.append(helper.make_tensor_value_info("probs", TensorProto.UINT8, probs))
    graph = helper.make_graph(
        nodes,
        "attention",
        inputs,
        outputs,
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return attach_functions(model)


def _feeds(seed: int = 0, shape: tuple = tuple(SHAPE)) -> dict:
    rng = np.random.default_rng(seed)
    return {n: rng.integers(-128, 128, shape).astype(np.int8) for n in ("q", "k", "v")}


def _fused_names(model) -> list[str]:
    prepared = prepare_for_tvm(model, keep_ops=KERNEL_OPS)
    mod, _ = import_relax(prepared, io_specs(prepared)[0])
    return sorted(
        gv.name_hint
        for gv, f in fuse(mod, make_target("llvm")).functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    )


@pytest.mark.parametrize("probs_output,a_zero_point", [(True, None), (False, 3)])
def test_attention_fusion_bitexact_on_llvm(probs_output, a_zero_point):
    """Kernels (with the fusions) == numpy reference, on random and saturating inputs; P·V is a uint8 GEMM
    (no shift of the probabilities, no column-sum kernel unless their zero point is not 0); with the
    probabilities also a graph output, both the plain row kernel and the one with row sums run."""
    model = attention_model(probs_output, a_zero_point)
    names = _fused_names(model)
    assert any("ivit_requantize_ivit_shiftmax" in n for n in names), names  # widening inside the row kernel
    assert not any("cast_subtract" in n for n in names), names  # no separate uint8 -> int8 shift kernel
    assert any("sum" in n for n in names) == bool(a_zero_point), names  # V's column sums only for za != 0
    art = compile_model(model)
    for feeds in (_feeds(0), {n: np.full(SHAPE, 127, np.int8) for n in ("q", "k", "v")}):
        for out, ref in zip(art.run(feeds), evaluator(model).run(None, feeds), strict=True):
            assert out.dtype == ref.dtype
            np.testing.assert_array_equal(out, ref)


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@needs_nvcc
def test_attention_gemms_write_no_int32_on_cuda():
    """Both attention GEMMs on int8 tensor cores, neither storing int32; the only 64-bit division is the row
    kernel's (one per row)."""
    art = compile_model(attention_model(), target="cuda", arch="sm_90")
    (source,) = cuda_sources(art.module)
    p = measure(art.module.as_text(), source, to_ptx(source, "sm_90"))
    assert (p.gemms, p.int8_tc_gemms, p.int32_gemm_outputs) == (2, 2, 0), p.gemm_calls
    assert list(p.div64.values()) == [1] and "shiftmax" in next(iter(p.div64)), p.div64
    assert p.untraced == []


def test_row_kernels_compute_their_own_row_on_cuda():
    """Every local array of the Shiftmax/ILayerNorm kernels holds one value: a thread block computes its own
    row's reductions and square root (a two-output stage once made each block compute all rows' values)."""
    art = compile_model(chain_model(np.random.default_rng(0), tokens=12), target="cuda", arch="sm_90")
    (source,) = cuda_sources(art.module)
    rows = {n: k for n, k in kernels(source).items() if re.match(r"ivit_(?:ilayernorm|shiftmax)", n)}
    assert len(rows) == 2, list(rows)
    for name, kernel in rows.items():
        sizes = {int(s) for s in re.findall(r"alignas\(\d+\) [\w ]+?_local_ptr\[(\d+)\];", kernel.body)}
        assert sizes == {1}, (name, sizes)


LONG_ROWS = (1, 2, 150, 64)  # 150 tokens: a Shiftmax row kernel of 64 threads, up to 3 elements each


def test_long_rows_bitexact_on_llvm():
    """P·V's zero-point term from the Shiftmax kernel's row sums, on rows longer than a thread's share."""
    model = attention_model(shape=LONG_ROWS)
    art = compile_model(model)
    feeds = _feeds(1, LONG_ROWS)
    for out, ref in zip(art.run(feeds), evaluator(model).run(None, feeds), strict=True):
        np.testing.assert_array_equal(out, ref)


@needs_nvcc
def test_shiftmax_row_sums_read_what_each_thread_stored_on_cuda():
    """The row sums read the probabilities back from global memory without a barrier: only safe because
    every CUDA thread reads exactly the elements it stored (same index expressions)."""
    art = compile_model(attention_model(shape=LONG_ROWS), target="cuda", arch="sm_90")
    (source,) = cuda_sources(art.module)
    (kernel,) = [k for n, k in kernels(source).items() if "shiftmax" in n]
    out = next(p for p, t in kernel.params.items() if p.startswith("ivit_shiftmax") and "char" in t)
    def where(pattern):  # index expressions, serial loop variables named alike (their splits are the same)
        found = re.findall(pattern, kernel.body)
        return {re.sub(r"(?<![.\w])(?!int\b|threadIdx\b|blockIdx\b)[A-Za-z_]\w*", "i", e) for e in found}

    stored = where(rf"\b{out}\[([^\]]+)\]\s*=(?!=)")
    read = where(rf"\b{out}\[([^\]]+)\](?!\s*=(?!=))")
    assert stored and read, kernel.body
    assert read <= stored, (read, stored)


def patch_model(per_channel: bool) -> onnx.ModelProto:
    """A patch embedding as the rewriter emits it: ConvInteger (kernel == stride) + int32 bias, a widening
    Requantize, ``flatten(2).transpose(1, 2)`` and the int8 Requantize."""
    rng = np.random.default_rng(3)
    o, i64 = 16, np.int64
    m_shape = (o, 1, 1) if per_channel else ()
    c = {
        "w": rng.integers(-128, 128, (o, 3, 4, 4)).astype(np.int8),
        "bias": rng.integers(-(2**12), 2**12, (o, 1, 1)).astype(np.int32),
        "i32_zp": np.int32(0),
        "i8_zp": np.int8(-3),
        "w_m": rng.integers(1 << 20, 1 << 21, m_shape).astype(i64),
        "w_c": np.full(m_shape, 19, i64),
        "o_m": i64(1 << 20),
        "o_c": i64(27),
        "flat": np.array([0, o, -1], i64),
    }
    nodes = [
        helper.make_node("ConvInteger", ["x", "w"], ["acc"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Add", ["acc", "bias"], ["accb"]),
        OPS["Requantize"].make_node(
            ["accb", "i32_zp", "w_m", "w_c", "i32_zp"], ["wide"], qmin=-(2**31), qmax=2**31 - 1
        ),
        helper.make_node("Reshape", ["wide", "flat"], ["flat_out"]),
        helper.make_node("Transpose", ["flat_out"], ["tokens"], perm=[0, 2, 1]),
        OPS["Requantize"].make_node(["tokens", "i32_zp", "o_m", "o_c", "i8_zp"], ["y"], qmin=-128, qmax=127),
    ]
    graph = helper.make_graph(
        nodes,
        "patch",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [2, 16, o])],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()],
    )
    return attach_functions(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    )


@pytest.mark.parametrize("per_channel", [False, True])
def test_patch_embedding_epilogue_fuses_into_the_gemm(per_channel):
    """The layout round trip is undone at import (``kernels.layout``): bias, both Requantizes and the GEMM are
    one fused function, and the result equals the numpy reference on llvm."""
    model = patch_model(per_channel)
    names = _fused_names(model)
    gemm = [n for n in names if "matmul" in n]
    assert (
        len(gemm) == 1 and gemm[0].startswith("fused_matmul_add_") and gemm[0].count("ivit_requantize") == 2
    )
    assert len(names) == 2, names  # the other: gathering the patches (reshape, transpose, reshape)
    rng = np.random.default_rng(4)
    for x in (
        rng.integers(-128, 128, (2, 3, 16, 16)).astype(np.int8),
        np.full((2, 3, 16, 16), -128, np.int8),
    ):
        (out,) = compile_model(model).run({"x": x})
        np.testing.assert_array_equal(out, evaluator(model).run(None, {"x": x})[0])


def test_ops_differing_in_constants_share_one_kernel():
    """Two Shiftmax ops with different ``x0`` (runtime multiply-and-shift division) and two table ShiftGELU
    ops with different ranges (padded tables, runtime start) compile to one kernel each, bit-exact."""
    i64, q = np.int64, {"qmin": -128, "qmax": 127}
    c = {"u8_zp": np.uint8(0), "i8_zp": np.int8(0), "g_m": i64(1 << 18), "g_c": i64(26)}
    nodes = [
        OPS["Shiftmax"].make_node(["s", "u8_zp"], ["p1"], x0=1226, n=30, bits=8),
        OPS["Shiftmax"].make_node(["s", "u8_zp"], ["p2"], x0=977, n=30, bits=8),
        OPS["ShiftGELU"].make_node(["s", "g_m", "g_c", "i8_zp"], ["g1"], x0=1054, n=30, bits=15, **q),
        OPS["ShiftGELU"].make_node(["s", "g_m", "g_c", "i8_zp"], ["g2"], x0=1311, n=30, bits=15, **q),
    ]
    shape = [2, 3, 40]
    outs = [helper.make_tensor_value_info(n, TensorProto.UINT8, shape) for n in ("p1", "p2")]
    outs += [helper.make_tensor_value_info(n, TensorProto.INT8, shape) for n in ("g1", "g2")]
    graph = helper.make_graph(
        nodes,
        "consts",
        [helper.make_tensor_value_info("s", TensorProto.INT32, shape)],
        outs,
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()],
    )
    model = attach_functions(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    )
    names = _fused_names(model)
    assert sum("shiftmax" in n for n in names) == 1 and sum("shiftgelu" in n for n in names) == 1, names
    rng = np.random.default_rng(9)
    s = rng.integers(-(2**15), 2**15, shape).astype(np.int32)
    s[0, 0, :4] = [-(2**31), 2**31 - 1, 0, -1]
    for out, ref in zip(
        compile_model(model).run({"s": s}), evaluator(model).run(None, {"s": s}), strict=True
    ):
        np.testing.assert_array_equal(out, ref)
