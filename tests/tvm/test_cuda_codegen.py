"""CUDA: int8 MatMulInteger lowers to int8 tensor cores (wmma s8) for sm_80 and sm_90 (nvcc's PTX, no GPU
needed), also where a GEMM extent is below 16 (padded to the tile; uint8 GEMMs and the padding:
test_cuda_tc.py). With a GPU (``-m gpu``) the compiled graphs are bit-exact."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from _tvm_cases import GENERATORS, batch_feeds, batch_model, chain_model

from ivit_onnx.opset import OPS
from ivit_onnx.opset.reference import evaluator

tvm = pytest.importorskip("tvm")
from ivit_onnx.engines.tvm import compile_model  # noqa: E402
from ivit_onnx.engines.tvm.cuda import cuda_sources, int8_instructions, to_ptx  # noqa: E402

pytestmark = pytest.mark.tvm

WMMA_S8 = "wmma.mma.sync.aligned.row.col.m16n16k16.s32.s8.s8.s32"


def _kernels(source: str) -> list[str]:
    """The ``__global__`` kernel definitions of a CUDA source, one string each."""
    parts = source.split('extern "C" __global__')
    return [p for p in parts[1:] if -1 < p.find("{") and (p.find(";") == -1 or p.find("{") < p.find(";"))]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_int8_matmul_uses_tensor_cores(arch):
    model = chain_model(np.random.default_rng(0), tokens=32, dim=64, hidden=128)
    art = compile_model(model, target="cuda", arch=arch)
    assert art.info["int8_matmuls"] == 2 and art.target["arch"] == arch
    (source,) = cuda_sources(art.module)
    wmma = [k for k in _kernels(source) if "wmma::mma_sync" in k]
    assert len(wmma) == 2, "both MatMulIntegers should run on int8 tensor cores"
    assert all("wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, signed char" in k for k in wmma)
    counts = int8_instructions(to_ptx(source, arch))
    assert counts.get(WMMA_S8, 0) > 0, counts


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_small_int8_matmul_uses_tensor_cores(arch):
    """M = 8 and K = 16 (below one 16x16 tile in M): padded to the tile, still wmma s8, no dp4a."""
    model = chain_model(np.random.default_rng(0), tokens=4, dim=16, hidden=32)
    art = compile_model(model, target="cuda", arch=arch)
    (source,) = cuda_sources(art.module)
    assert len([k for k in _kernels(source) if "wmma::mma_sync" in k]) == 2
    counts = int8_instructions(to_ptx(source, arch))
    assert counts.get(WMMA_S8, 0) > 0 and not any(i.startswith("dp4a") for i in counts), counts


def _gpu_arch() -> str:
    major, minor = tvm.cuda(0).compute_version.split(".")
    return f"sm_{major}{minor}"


needs_gpu = pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")


@pytest.mark.gpu
@needs_gpu
def test_chain_bitexact_on_gpu():
    rng = np.random.default_rng(0)
    model = chain_model(rng, tokens=32, dim=64, hidden=128)
    x = rng.integers(0, 256, (2, 32, 64)).astype(np.uint8)
    art = compile_model(model, target="cuda", arch=_gpu_arch())
    for out, ref in zip(art.run({"x": x}), evaluator(model).run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(out, ref)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_op_bitexact_on_gpu(op):
    rng = np.random.default_rng(11)
    cases = [GENERATORS[op](rng, shape) for shape in [(3, 1), (2, 3, 16), (1, 4, 197), (2, 64, 64)]]
    art = compile_model(batch_model(op, cases), target="cuda", arch=_gpu_arch())
    for (inputs, attrs), out in zip(cases, art.run(batch_feeds(cases)), strict=True):
        np.testing.assert_array_equal(out, OPS[op].run(*inputs, **attrs))
