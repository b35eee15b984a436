"""llvm GEMMs (engines/tvm/cpu_gemm.py): int8 on AVX-512 VNNI or AVX2 bit for bit, FP32 close to onnxruntime
(every GEMM form on every path: test_cpu_gemm_forms.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

tvm = pytest.importorskip("tvm")
import onnxruntime as ort  # noqa: E402

from ivit_onnx.engines.tvm import compile_model  # noqa: E402
from ivit_onnx.engines.tvm.compile import make_target  # noqa: E402
from ivit_onnx.engines.tvm.cpu_gemm import (  # noqa: E402
    AVX2,
    VNNI,
    VNNI_ENV,
    has_vnni,
    llvm_asm,
    pack_dot,
    pack_f32,
)
from ivit_onnx.opset.functions import attach_functions  # noqa: E402

#: a VNNI CPU: the instruction check compiles for it on any x86 host (running needs the host to have VNNI)
VNNI_TARGET = {"kind": "llvm", "mcpu": "cascadelake", "mtriple": "x86_64-linux-gnu", "num-cores": 2}
HOST_VNNI = has_vnni(make_target("llvm"))


def test_packed_layouts():
    rng = np.random.default_rng(0)
    w8 = rng.integers(-128, 128, (8, 32)).astype(np.int8)
    p8, p16 = pack_dot(w8, VNNI), pack_dot(w8, AVX2)
    assert (p8.dtype, p16.dtype) == (np.int8, np.int16)
    wf = rng.standard_normal((8, 32)).astype(np.float32)
    pf = pack_f32(wf)
    for k in range(8):
        for n in range(32):
            assert p8[n // 16, k // 4, n % 16, k % 4] == w8[k, n]
            assert p16[n // 8, k // 2, n % 8, k % 2] == w8[k, n]
            assert pf[n // 16, k, n % 16] == wf[k, n]


def gemm_model(batch: int, m: int, k: int, n: int, x_zp: int, seed: int = 0):
    """``MatMulInteger(x: uint8, W: int8 constant, x_zp)`` with extreme weights; returns (model, W)."""
    w = np.random.default_rng(seed).choice(np.array([-128, 127, -1, 0, 1], np.int8), (k, n))
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w", "zp"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [batch, m, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [batch, m, n])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.uint8(x_zp), "zp")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), w


# (batch, tokens, K, N): rows tiled from M (16), from the batch (M = 17 prime), neither (1 x 13); the last
# has K % 4 and N % 16 != 0 (not packed: the generic schedule)
SHAPES = [(2, 16, 64, 48), (4, 17, 96, 32), (1, 13, 128, 64), (3, 5, 30, 20)]


@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_integer_bit_exact(shape):
    batch, m, k, n = shape
    model, w = gemm_model(batch, m, k, n, x_zp=131)
    x = np.random.default_rng(1).choice(np.array([0, 255, 131, 7], np.uint8), (batch, m, k))
    (y,) = compile_model(model).run({"x": x})
    expected = (x.astype(np.int64) - 131) @ w.astype(np.int64)
    np.testing.assert_array_equal(y, expected.astype(np.int32))


ATTENTION = [("int8", "int8", (2, 3, 17, 64), (2, 3, 64, 17)),
             ("uint8", "uint8", (2, 3, 17, 17), (2, 3, 17, 64)),
             ("uint8", "int8", (1, 2, 9, 30), (1, 2, 30, 40)),
             ("int8", "uint8", (2, 1, 16, 64), (2, 1, 64, 32))]


@pytest.mark.parametrize("a_type,b_type,a_shape,b_shape", ATTENTION)
def test_matmul_of_activations_bit_exact(a_type, b_type, a_shape, b_shape):
    """Attention-style batched GEMMs of two 8-bit activations (packed at run time, padded to N % 16 and
    K % 4), every signedness, extreme values."""
    types = {"int8": (TensorProto.INT8, [-128, 127, -1, 0]), "uint8": (TensorProto.UINT8, [0, 255, 128, 1])}
    out_shape = [*a_shape[:-1], b_shape[-1]]
    g = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "mm",
        [helper.make_tensor_value_info("a", types[a_type][0], a_shape),
         helper.make_tensor_value_info("b", types[b_type][0], b_shape)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, out_shape)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    rng = np.random.default_rng(2)
    a = rng.choice(np.array(types[a_type][1], a_type), a_shape)
    b = rng.choice(np.array(types[b_type][1], b_type), b_shape)
    (y,) = compile_model(model).run({"a": a, "b": b})
    np.testing.assert_array_equal(y, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32))


def test_without_vnni_int8_gemms_stay_exact(monkeypatch):
    """VNNI switched off (``IVIT_TVM_VNNI=0``, as on a CPU without it): exact without ``vpdpbusd`` (which form
    runs instead: test_cpu_gemm_forms.py)."""
    monkeypatch.setenv(VNNI_ENV, "0")
    model, w = gemm_model(4, 17, 96, 32, x_zp=131)
    x = np.random.default_rng(1).choice(np.array([0, 255, 131, 7], np.uint8), (4, 17, 96))
    art = compile_model(model)
    assert "vpdpbusd" not in llvm_asm(art.module)
    (y,) = art.run({"x": x})
    np.testing.assert_array_equal(y, ((x.astype(np.int64) - 131) @ w.astype(np.int64)).astype(np.int32))


def test_int8_gemms_use_vpdpbusd_and_fp32_ones_fma(monkeypatch):
    monkeypatch.delenv(VNNI_ENV, raising=False)
    model, _ = gemm_model(2, 16, 64, 48, x_zp=0)
    assert "vpdpbusd" in llvm_asm(compile_model(model, target=VNNI_TARGET).module)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 64])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "f32", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 48])],
                          initializer=[numpy_helper.from_array(np.ones((64, 48), np.float32), "w")])
    asm = llvm_asm(compile_model(helper.make_model(g, ir_version=10), target=VNNI_TARGET).module)
    assert "vpdpbusd" not in asm and "vfmadd231ps\t%zmm" in asm.replace("{1to16}", "")


@pytest.mark.skipif(not HOST_VNNI, reason="the host CPU has no AVX-512 VNNI")
def test_host_build_uses_vpdpbusd():
    model, _ = gemm_model(2, 16, 64, 48, x_zp=0)
    assert "vpdpbusd" in llvm_asm(compile_model(model).module)


def test_small_deit_int_exact_and_fp32_close(tmp_path):
    """One-block DeiT: the integer build equals onnxruntime's run of the function bodies bit for bit (batch 3:
    odd, 17 tokens, so 1-row tiles); the FP32 build (patch conv as a packed GEMM) within float rounding."""
    from _deit_cases import SMALL_DEIT, deit_pair

    paths, size = deit_pair(tmp_path), SMALL_DEIT["img_size"]
    x = np.random.default_rng(0).standard_normal((3, 3, size, size)).astype(np.float32)
    int_model, fp32_model = onnx.load(paths["int"]), onnx.load(paths["fp32"])
    for model, exact in ((int_model, True), (fp32_model, False)):
        ref = attach_functions(model) if exact else model
        (expected,) = ort.InferenceSession(ref.SerializeToString(),
                                           providers=["CPUExecutionProvider"]).run(None, {"input": x})
        art = compile_model(model, shape={"input": list(x.shape)})
        (out,) = art.run({"input": x})
        if exact:
            np.testing.assert_array_equal(out, expected)
            assert ("vpdpbusd" in llvm_asm(art.module)) == HOST_VNNI
        else:
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
