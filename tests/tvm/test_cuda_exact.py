"""CUDA exactness without a GPU: the input QuantizeLinear is lowered so that fast math cannot change it, and
ivit-onnx compiles CUDA with IEEE float flags (the PTX of an integer build holds no approximate or
flush-to-zero float instruction). With a GPU (``-m gpu``): whole DeiT-Tiny/Small outputs equal
onnxruntime's bit for bit at batch 8 and 64."""

from __future__ import annotations

import contextlib
import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.opset import OPS
from ivit_onnx.opset.functions import attach_functions

tvm = pytest.importorskip("tvm")
ort = pytest.importorskip("onnxruntime")
from ivit_onnx.engines.tvm import compile_model  # noqa: E402
from ivit_onnx.engines.tvm import cuda as tvm_cuda  # noqa: E402

pytestmark = pytest.mark.tvm
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

#: float instructions whose result depends on fast math: approximate division/sqrt/transcendentals,
#: the ``div.full`` fast division and anything flushing subnormals to zero
INEXACT_PTX = re.compile(r"\b(?:div\.full|\w+\.approx)[\w.]*|\.ftz\b")
#: the scale of DeiT-Tiny's input QuantizeLinear whose fast-math division was off by one (issue #9)
DEIT_SCALE = np.float32(float.fromhex("0x1.4d7ed4p-5"))


def _quantize_model(scale, zp, shape, axis: int = 1) -> onnx.ModelProto:
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=axis)
    elem = helper.np_dtype_to_tensor_dtype(np.asarray(zp).dtype)
    g = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", elem, shape)],
        initializer=[
            numpy_helper.from_array(np.asarray(scale, np.float32), "s"),
            numpy_helper.from_array(np.asarray(zp), "z"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _near_midpoints(rng, scale, shape) -> np.ndarray:
    """float32 values whose quotient by ``scale`` lies one ulp from ``k + 0.5`` (where rounding flips)."""
    k = rng.integers(-140, 140, shape) + 0.5
    x = (k * np.asarray(scale, np.float64)).astype(np.float32)
    x = np.nextafter(x, np.where(rng.random(shape) < 0.5, -np.inf, np.inf).astype(np.float32))
    x.reshape(-1)[:4] = [0.0, -0.0, 1e-40, -1e-40]  # signed zeros and subnormals
    return x


@pytest.mark.parametrize("zp", [np.int8(3), np.uint8(128)])
def test_quantize_equals_onnxruntime_near_rounding_midpoints(zp):
    rng = np.random.default_rng(0)
    cases = [
        (DEIT_SCALE, (4, 1000), 1),
        (np.float32(0.1), (4, 1000), 1),
        (np.array([0.013, 0.7, 3.0], np.float32), (2, 3, 500), 1),
    ]
    for scale, shape, axis in cases:
        zps = np.full(np.shape(scale), zp, np.asarray(zp).dtype)
        model = _quantize_model(scale, zps, shape, axis)
        bshape = (1, -1, 1) if np.ndim(scale) else ()
        x = _near_midpoints(rng, np.reshape(scale, bshape), shape)
        expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        np.testing.assert_array_equal(compile_model(model).run({"x": x})[0], expected)


def test_quantize_rejects_scales_where_flush_to_zero_could_matter():
    with pytest.raises(ValueError, match="2\\*\\*-125"):
        compile_model(_quantize_model(np.float32(2.0**-127), np.int8(0), (2, 4)))


def test_nvcc_command_is_ieee():
    exact = tvm_cuda.nvcc_command("k.cu", "k.fatbin", "sm_90")
    assert "--use_fast_math" not in exact and set(tvm_cuda.EXACT_FLAGS) <= set(exact)
    assert "arch=compute_90,code=sm_90" in exact and exact[1] == "--fatbin"
    assert "--use_fast_math" in tvm_cuda.nvcc_command("k.cu", "k.ptx", "sm_90", "ptx", exact=False)


def test_exact_callback_is_registered_only_inside_the_block():
    import tvm_ffi

    name = "tvm_callback_cuda_compile"
    previous = tvm_cuda.compile_callback()
    tvm_ffi.register_global_func(name, lambda code, *target: b"sentinel", override=True)
    try:
        with tvm_cuda.exact_cuda_compile() as callback:
            assert callback is tvm_cuda._exact_callback
            if shutil.which("nvcc"):
                with tvm.target.Target({"kind": "cuda", "arch": "sm_80"}):
                    binary = bytes(tvm_cuda.compile_callback()('extern "C" __global__ void k() {}'))
                assert binary != b"sentinel" and len(binary) > 100
        assert bytes(tvm_cuda.compile_callback()("")) == b"sentinel"
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(name, previous, override=True)


def test_compile_model_uses_the_exact_callback_on_cuda(monkeypatch):
    entered = []

    @contextlib.contextmanager
    def recording():
        entered.append(True)
        yield

    monkeypatch.setattr(tvm_cuda, "exact_cuda_compile", recording)
    model = _quantize_model(np.float32(0.5), np.int8(0), (2, 64))
    assert not compile_model(model, target="cuda", arch="sm_80").info["fast_math"] and entered == [True]
    compile_model(model, target="cuda", arch="sm_80", fast_math=True)
    compile_model(model, target="llvm")
    assert entered == [True]


def io_model(rng, tokens: int = 32, dim: int = 64, hidden: int = 128) -> onnx.ModelProto:
    """float -> QuantizeLinear -> MatMulInteger + bias -> Requantize -> DequantizeLinear -> float: the
    integer graph's float boundary around one GEMM."""
    w = rng.integers(-128, 128, (dim, hidden)).astype(np.int8)
    c = {
        "s": DEIT_SCALE,
        "z": np.uint8(128),
        "w": w,
        "b": rng.integers(-(2**14), 2**14, hidden).astype(np.int32),
        "zp32": np.int32(0),
        "zp8": np.int8(0),
        "m": rng.integers(1 << 20, 1 << 21, hidden).astype(np.int64),
        "c": np.full(hidden, 28, np.int64),
        "so": np.float32(0.0625),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
        helper.make_node("MatMulInteger", ["q", "w", "z"], ["acc"]),
        helper.make_node("Add", ["acc", "b"], ["accb"]),
        OPS["Requantize"].make_node(["accb", "zp32", "m", "c", "zp8"], ["r"], qmin=-128, qmax=127),
        helper.make_node("DequantizeLinear", ["r", "so", "zp8"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "io",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, tokens, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, tokens, hidden])],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()],
    )
    return attach_functions(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))


def test_io_model_bitexact_on_llvm():
    """(The reference on onnxruntime's exact kernels: its uint8 x int8 GEMM saturates without VNNI.)"""
    from ivit_onnx.runners import exact_weight_gemms

    rng = np.random.default_rng(1)
    model = io_model(rng)
    x = _near_midpoints(rng, DEIT_SCALE, (2, 32, 64))
    opts = ort.SessionOptions()
    exact_weight_gemms(opts)
    expected = ort.InferenceSession(model.SerializeToString(), opts).run(None, {"x": x})[0]
    np.testing.assert_array_equal(compile_model(model).run({"x": x})[0], expected)


def _inexact(ptx: str) -> set[str]:
    return set(INEXACT_PTX.findall(ptx))


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_integer_build_ptx_has_no_inexact_float(arch):
    art = compile_model(io_model(np.random.default_rng(1)), target="cuda", arch=arch)
    (source,) = tvm_cuda.cuda_sources(art.module)
    assert "(double)" in source  # the quotient is taken in float64 (exact_quantize)
    assert not _inexact(tvm_cuda.to_ptx(source, arch)), "ivit-onnx's flags must keep float IEEE"
    # immune anyway: under TVM's own --use_fast_math no float32 division is approximate
    fast = tvm_cuda.to_ptx(source, arch, exact=False)
    assert "div.rn.f64" in fast and not re.search(r"\bdiv\.(?:approx|full)[\w.]*\.f32", fast)


def check_deit_against_onnxruntime(int_path, batches, size: int, **compile_args) -> None:
    """Compile the integer DeiT at each batch; its output equals onnxruntime's run of the function bodies
    (fresh ones, as the TVM path uses) bit for bit on random normal images."""
    model = onnx.load(int_path)
    reference = ort.InferenceSession(
        attach_functions(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(0)
    for batch in batches:
        art = compile_model(model, shape={"input": [batch, 3, size, size]}, **compile_args)
        x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
        (out,) = art.run({"input": x})
        (expected,) = reference.run(None, {"input": x})
        assert out.dtype == expected.dtype == np.float32
        np.testing.assert_array_equal(out, expected, err_msg=f"{int_path.name} batch {batch}")


@pytest.mark.slow
def test_small_deit_bitexact_on_llvm(tmp_path):
    """The GPU test's code path on the CPU, for a one-block DeiT-shaped model (head_dim 64)."""
    from _deit_cases import SMALL_DEIT, deit_pair

    check_deit_against_onnxruntime(deit_pair(tmp_path)["int"], (8, 64), SMALL_DEIT["img_size"])


@pytest.mark.gpu
@pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")
@pytest.mark.parametrize("name", ["deit_tiny", "deit_small"])
def test_deit_bitexact_on_gpu(name, tmp_path):
    """Whole DeiT outputs on the GPU equal onnxruntime's run of the function bodies, batch 8 and 64."""
    from _deit_cases import deit_pair

    major, minor = tvm.cuda(0).compute_version.split(".")
    paths = deit_pair(tmp_path, batch=4, name=f"{name}_patch16_224")
    check_deit_against_onnxruntime(paths["int"], (8, 64), 224, target="cuda", arch=f"sm_{major}{minor}")
