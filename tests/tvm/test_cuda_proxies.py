"""GPU speed proxies read from CUDA builds without a GPU (``ivit_onnx.engines.tvm.proxies``): the parsers on
hand-written code, then the counts of real builds (a chained block, a one-block DeiT-shaped pair)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from _tvm_cases import chain_model

from ivit_onnx.engines.tvm.proxies import div64_per_kernel, forward_calls, kernels, measure

SOURCE = """
extern "C" __global__ void __launch_bounds__(128) fused_matmul_add_kernel(int* __restrict__ acc_ptr,
    signed char* __restrict__ a_ptr) {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, signed char, nvcuda::wmma::row_major> f[1];
  if (threadIdx.x < 4) { acc_ptr[threadIdx.x] = ((int)a_ptr[0]) + 1; }
}
extern "C" __global__ void __launch_bounds__(128) fused_matmul1_rq_kernel(signed char* __restrict__ y_ptr,
    int* __restrict__ bias_ptr) {
  __shared__ int c_shared[256];
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, signed char, nvcuda::wmma::row_major> f[1];
  c_shared[threadIdx.x] = bias_ptr[threadIdx.x];
  if (c_shared[0] == 0) { y_ptr[threadIdx.x] = (signed char)c_shared[threadIdx.x]; }
}
extern "C" __global__ void __launch_bounds__(64) matmul2_kernel(int* __restrict__ out_ptr,
    signed char* __restrict__ b_ptr) {
  *(int4*)(out_ptr + (threadIdx.x * 4)) = make_int4(b_ptr[0], 0, 0, 0);
}
extern "C" __global__ void __launch_bounds__(64) softmax_kernel(float* __restrict__ p) { p[0] = 1.f; }
extern "C" __global__ void __launch_bounds__(64) softmax_kernel_1(float* __restrict__ p) { p[1] = 1.f; }
"""

VM_TEXT = """@main:
  call  vm.builtin.alloc_storage in: %vm, c[2], i0, c[0], c[3] dst: %1
  call  fused_matmul_add in: %0, c[1], %2 dst: %void
  call  fused_matmul1_rq in: %2, c[1], %3 dst: %void
  call  softmax          in: %3, %4       dst: %void
  call  matmul2          in: %4, c[5], %5 dst: %void
  call  softmax          in: %5, %6       dst: %void
  call  vm.builtin.null_value in:              dst: %2
@other:
  call  matmul2          in: %4, c[5], %5 dst: %void
"""

PTX = """
.visible .entry a_kernel(
) { div.s64 %rd1, %rd2, %rd3; rem.u64 %rd4, %rd5, %rd6; div.rn.f64 %fd1, %fd2, %fd3; }
.visible .entry b_kernel(
) { div.s32 %r1, %r2, %r3; }
.visible .entry c_kernel(
) { rem.s64 %rd1, %rd2, %rd3; }
"""


def test_parsers_on_handwritten_code():
    ks = kernels(SOURCE)
    assert list(ks) == [
        "fused_matmul_add_kernel",
        "fused_matmul1_rq_kernel",
        "matmul2_kernel",
        "softmax_kernel",
        "softmax_kernel_1",
    ]
    assert ks["fused_matmul_add_kernel"].stored_types() == {"int"}
    assert ks["fused_matmul1_rq_kernel"].stored_types() == {"signed char"}  # shared int and == are no stores
    assert ks["matmul2_kernel"].stored_types() == {"int"}  # vector store
    assert forward_calls(VM_TEXT) == ["fused_matmul_add", "fused_matmul1_rq", "softmax", "matmul2", "softmax"]
    assert div64_per_kernel(PTX) == {"a_kernel": 2, "c_kernel": 1}
    p = measure(VM_TEXT, SOURCE, PTX)
    assert (p.launches, p.gemms, p.int8_tc_gemms, p.int32_gemm_outputs, p.kernels) == (7, 3, 2, 2, 5)
    assert p.div64_total == 3 and p.untraced == [] and p.launch_calls == p.launches


GRAPH_VM_TEXT = """@main:
  call  fused_matmul_add in: %0, c[1], %2 dst: %void
  call  vm.builtin.cuda_graph.run_or_capture in: %vm, f[main_cuda_graph_capture], %15, i1 dst: %16
  call  softmax          in: %5, %6       dst: %void
@main_cuda_graph_capture:
  call  vm.builtin.match_shape in: %0, %void, i3 dst: %void
  call  fused_matmul1_rq in: %2, c[1], %3 dst: %void
  call  softmax          in: %3, %4       dst: %void
"""


def test_cuda_graph_replays_count_as_one_launch_call():
    captured = []
    assert forward_calls(GRAPH_VM_TEXT, captured) == [
        "fused_matmul_add",
        "fused_matmul1_rq",
        "softmax",
        "softmax",
    ]
    assert captured == [["fused_matmul1_rq", "softmax"]]
    p = measure(GRAPH_VM_TEXT, SOURCE)
    assert (p.launches, p.launch_calls, p.gemms) == (6, 4, 2)  # 1 + (1 + 2) in the graph + 2; 1 + 1 + 2


tvm = pytest.importorskip("tvm")
from ivit_onnx.engines.tvm import compile_model  # noqa: E402
from ivit_onnx.engines.tvm.cuda import cuda_sources, to_ptx  # noqa: E402

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def build_proxies(model, arch: str = "sm_90", **kwargs):
    art = compile_model(model, target="cuda", arch=arch, **kwargs)
    (source,) = cuda_sources(art.module)
    return measure(art.module.as_text(), source, to_ptx(source, arch, exact=not kwargs.get("fast_math")))


@pytest.mark.tvm
@needs_nvcc
def test_chain_block_proxies():
    """Both GEMMs of the chained block on int8 tensor cores; the first one's bias add + Requantize run in
    its kernel (int8 out), the second feeds Shiftmax and ILayerNorm, which need its int32 rows. Built with
    CUDA graphs, which capture part of the forward."""
    p = build_proxies(chain_model(np.random.default_rng(0), tokens=32, dim=64, hidden=128), cuda_graph=True)
    assert (p.gemms, p.int8_tc_gemms, p.int32_gemm_outputs) == (2, 2, 1)
    assert p.untraced == [] and p.launches >= p.kernels > 0
    assert p.launch_calls < p.launches  # with cuda_graph, captured kernels replay as one graph launch


@pytest.fixture(scope="module")
def small_deit_proxies(tmp_path_factory):
    """Proxies of a one-block DeiT-shaped pair (head_dim 64, 16 classes) at batch 16, integer and FP32."""
    from _deit_cases import SMALL_DEIT, deit_pair

    paths = deit_pair(tmp_path_factory.mktemp("deit"), num_classes=16)  # every GEMM extent >= 16
    shape = {"input": [16, 3, SMALL_DEIT["img_size"], SMALL_DEIT["img_size"]]}
    return {k: build_proxies(paths[k], shape=shape, fast_math=k == "fp32") for k in ("int", "fp32")}


@pytest.mark.tvm
@needs_nvcc
def test_small_deit_proxies(small_deit_proxies):
    """Patch embedding, QKV, Q·Kᵀ, P·V (head_dim 64), projection, MLP and head: every GEMM on int8 tensor
    cores, none storing int32 (their bias + Requantize, and the widening for Shiftmax / ShiftGELU, run in
    the GEMM kernel or the consumer's); 64-bit division only in the row kernels, once each (per row)."""
    i, f = small_deit_proxies["int"], small_deit_proxies["fp32"]
    assert i.gemms == f.gemms == 8 and i.int8_tc_gemms == i.gemms and f.int8_tc_gemms == 0
    assert i.int32_gemm_outputs == 0 and f.int32_gemm_outputs == 0
    assert set(i.div64.values()) == {1}, i.div64
    assert all("shiftmax" in k or "ilayernorm" in k for k in i.div64), i.div64
    assert i.untraced == [] and f.untraced == []


@pytest.mark.tvm
@needs_nvcc
def test_small_deit_launch_target(small_deit_proxies):
    """Fewer launches than the FP32 build: the input quantize, the Q/K/V split and transposes, the class-token
    gather run inside the GEMMs reading them (:mod:`ivit_onnx.engines.tvm.prologue`), and P·V needs no
    zero-point column-sum kernel; what remains besides the GEMMs is the row kernels and the token concat."""
    i, f = small_deit_proxies["int"], small_deit_proxies["fp32"]
    assert i.launches < f.launches, (i.calls, f.calls)
    gemms = {g[0] for g in i.gemm_calls}
    others = [c for c in i.calls if c not in gemms]
    alone = re.compile(r"ivit_ilayernorm|ivit_requantize_ivit_shiftmax\d*|fused_concatenate_ivit_iadd")
    assert all(alone.fullmatch(c) for c in others), others
