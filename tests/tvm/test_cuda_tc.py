"""CUDA: 8-bit GEMMs on tensor cores beyond dlight's s8 case (``engines.tvm.cuda.Int8TensorCoreMatmul``):
uint8 x uint8 on ``uchar`` wmma fragments (``wmma.mma...s32.u8.u8.s32``), also with an elementwise producer
of an operand and a narrowing epilogue in the same kernel, and GEMMs with M < 16 and N < 16 (a batch-8
classifier head) padded to the tile. Built for sm_80/sm_90 and checked in nvcc's PTX, no GPU needed; the
same GEMMs run bit for bit against numpy on llvm (the harness) and, with ``-m gpu``, on the GPU."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from _tvm_cases import WMMA  # noqa: E402
from tvm import te  # noqa: E402

from ivit_onnx.engines.tvm.compile import make_target  # noqa: E402
from ivit_onnx.engines.tvm.cuda import (  # noqa: E402
    cuda_sources,
    gpu_schedules,
    int8_instructions,
    record_launch_grids,
    register_u8_wmma,
    to_ptx,
)
from ivit_onnx.engines.tvm.proxies import kernels, measure  # noqa: E402
from ivit_onnx.engines.tvm.tc_gemm import choose_tile, gemm_blocks  # noqa: E402

pytestmark = pytest.mark.tvm
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

FRAGMENT = {"uint8": "uchar", "int8": "signed char"}
SHIFT = 7  # the epilogue: int8(acc >> SHIFT), wrapping as a cast does

#: (M, K, N, operand dtype, fused): ``fused`` computes A from an int32 input in a producer block of the same
#: PrimFunc (``uint8|int8(a + 3)``, wrapping) and narrows the int32 product to int8 in an epilogue block
CASES = {
    "u8": (64, 64, 64, "uint8", False),
    "u8_fused": (48, 96, 80, "uint8", True),
    "u8_head": (8, 64, 10, "uint8", True),
    "s8_head": (8, 128, 10, "int8", True),
}


def gemm_func(m: int, k: int, n: int, dtype: str, fused: bool, b_dtype: str | None = None):
    """``matmul(a, b, y)``: ``y = a @ b`` in int32 on ``dtype`` operands (``b_dtype`` for B if given),
    optionally ``fused`` (CASES), the blocks a fused Relax GEMM has (producer, reduction, epilogue)."""
    a = te.placeholder((m, k), "int32" if fused else dtype, name="a")
    b = te.placeholder((k, n), b_dtype or dtype, name="b")
    x = te.compute((m, k), lambda i, j: (a[i, j] + 3).astype(dtype), name="operand") if fused else a
    r = te.reduce_axis((0, k), name="k")
    acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("int32") * b[r, j].astype("int32"), axis=r),
                     name="gemm")
    y = te.compute((m, n), lambda i, j: (acc[i, j] >> SHIFT).astype("int8"), name="narrow") if fused else acc
    return te.create_prim_func([a, b, y]).with_attr("global_symbol", "matmul")


def inputs(m, k, n, dtype, fused, seed=0):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    a = rng.integers(-(2**31), 2**31, (m, k), dtype=np.int64).astype(np.int32) if fused else \
        rng.integers(info.min, info.max, (m, k), endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, (k, n), endpoint=True).astype(dtype)
    if not fused:  # the largest products: min*min and max*max
        a.flat[:2], b.flat[:2] = (info.min, info.max), (info.min, info.max)
    return a, b


def reference(a, b, dtype, fused):
    x = (a.astype(np.int64) + 3).astype(dtype) if fused else a  # int32 wraps before the cast: same low byte
    y = (x.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    return (y >> SHIFT).astype(np.int8) if fused else y


def build(case, target: str, arch: str = "sm_80"):
    """The PrimFunc of a case (name or gemm_func arguments) built for llvm (unscheduled) or cuda
    (:func:`.cuda.gpu_schedules`)."""
    tgt = make_target(target, arch if target == "cuda" else None)
    mod = tvm.IRModule({"matmul": gemm_func(*(CASES[case] if isinstance(case, str) else case))})
    if target == "cuda":
        with tgt:
            mod = gpu_schedules()(mod)
    return tvm.compile(mod, target=tgt)


def test_u8_wmma_registration_is_idempotent():
    from tvm import s_tir

    names = register_u8_wmma()
    assert register_u8_wmma() == names
    assert all(s_tir.TensorIntrin.get(n, allow_missing=True) is not None for n in names.values())


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gemm_on_tensor_cores(case, arch):
    """One kernel holding the GEMM (and its producer and epilogue), on wmma fragments of the operand type;
    the PTX multiplies with that type's wmma only; a narrowing epilogue stores int8, never int32; the
    proxies count it as an int8 tensor-core GEMM."""
    _m, _k, _n, dtype, fused = CASES[case]
    (source,) = cuda_sources(build(case, "cuda", arch))
    (kernel,) = kernels(source).values()
    assert f"wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, {FRAGMENT[dtype]}," in kernel.body
    assert f"wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, {FRAGMENT[dtype]}," in kernel.body
    p = measure("@main:\n  call  matmul in: %0, %1, %2 dst: %void\n", source)
    assert (p.gemms, p.int8_tc_gemms, p.int32_gemm_outputs) == (1, 1, 0 if fused else 1), p.gemm_calls
    counts = int8_instructions(to_ptx(source, arch))
    assert counts.get(WMMA[dtype], 0) > 0, counts
    assert not [i for i in counts if ("mma.sync" in i and i != WMMA[dtype]) or "dp4a" in i], counts
    assert kernel.stored_types() == ({"signed char"} if fused else {"int"})


@needs_nvcc
def test_mixed_u8_s8_gemm_stays_off_tensor_cores():
    """CUDA's wmma has no u8 x s8 form: such a GEMM is left to dlight's generic rule (dp4a)."""
    (source,) = cuda_sources(build((64, 64, 64, "uint8", False, "int8"), "cuda", "sm_90"))
    counts = int8_instructions(to_ptx(source, "sm_90"))
    assert "wmma" not in source and any(i.startswith("dp4a") for i in counts), counts


def _check(case: str, target: str, dev):
    m, k, n, dtype, fused = CASES[case]
    func = build(case, target, _gpu_arch() if target == "cuda" else "sm_80")["matmul"]
    for seed in range(3):
        a, b = inputs(m, k, n, dtype, fused, seed)
        expected = reference(a, b, dtype, fused)
        out = tvm.runtime.tensor(np.zeros_like(expected), dev)
        func(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), out)
        np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gemm_bitexact_on_llvm(case):
    """The cases and their numpy reference agree on llvm (unscheduled, no tensor cores: the harness)."""
    _check(case, "llvm", tvm.cpu())


def _gpu_arch() -> str:
    major, minor = tvm.cuda(0).compute_version.split(".")
    return f"sm_{major}{minor}"


@pytest.mark.gpu
@pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")
@pytest.mark.parametrize("case", sorted(CASES))
def test_gemm_bitexact_on_gpu(case):
    """The tensor-core GEMMs (u8 wmma, padded small M/N) bit for bit, padding rows never written."""
    _check(case, "cuda", tvm.cuda(0))


@needs_nvcc
def test_batch8_deit_head_on_tensor_cores(tmp_path):
    """A one-block DeiT at batch 8 with 10 classes: the head (M = 8, N = 10) and every other GEMM on int8
    tensor cores, none storing int32, each on the tile ``choose_tile`` picks (its grid)."""
    from _deit_cases import SMALL_DEIT, deit_pair
    from test_cuda_proxies import build_proxies
    from test_cuda_tiles import deit_gemms

    paths = deit_pair(tmp_path, num_classes=10)
    with record_launch_grids() as grids:
        size = SMALL_DEIT["img_size"]
        p = build_proxies(paths["int"], shape={"input": [8, 3, size, size]})
    assert p.gemms == 8 and p.int8_tc_gemms == p.gemms, p.gemm_calls
    assert p.int32_gemm_outputs == 0, p.gemm_calls
    # our per-GEMM tiles (tc_gemm.py), not dlight's 512-thread 128x128 one: the grids choose_tile gives on an
    # H100 for (GEMM batch, M, N): patch, QKV, Q·Kᵀ and P·V per (image, head), proj, fc1, fc2, head
    tokens = (size // SMALL_DEIT["patch_size"]) ** 2 + 1
    shapes = deit_gemms(8, SMALL_DEIT["embed_dim"], SMALL_DEIT["num_heads"], tokens, classes=10).values()
    expected = [choose_tile(*s, 132).grid(*s) for s in shapes]
    assert gemm_blocks(p.gemm_calls, grids) == expected, p.gemm_calls
    assert all(t <= 256 for g, _tc, _i32 in p.gemm_calls for _b, t in grids[g])
