"""CUDA: the per-GEMM block tile of our 8-bit tensor-core schedule (``engines.tvm.tc_gemm``): the tile
choice (grids of at least one block per SM where the problem allows, N = 64 on a 64-wide tile, a small-M
head on a 16-row tile), every tile of the table building to wmma of the operand type with no int32
stored by a narrowing epilogue, and the launch geometry read back from the scheduled TIR. Built for
sm_90/sm_80 and checked in nvcc's PTX, no GPU needed; with ``-m gpu`` every tile runs bit for bit against
numpy (the llvm harness of the same GEMMs is test_cuda_tc.py's)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from _tvm_cases import WMMA  # noqa: E402
from tvm import te  # noqa: E402

from ivit_onnx.engines.tvm import cuda  # noqa: E402
from ivit_onnx.engines.tvm.compile import make_target  # noqa: E402
from ivit_onnx.engines.tvm.proxies import kernels  # noqa: E402
from ivit_onnx.engines.tvm.tc_gemm import (  # noqa: E402
    LOAD_VECTOR,
    STORE_VECTOR,
    TILES,
    WARP,
    Tile,
    choose_tile,
    gemm_blocks,
    max_edge,
    schedule_tc_gemm,
    sm_count,
)

pytestmark = pytest.mark.tvm
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

SHIFT = 9
H100 = 132


def deit_gemms(batch: int, dim: int, heads: int, tokens: int = 197, classes: int = 1000) -> dict:
    """(GEMM batch, M, N) of a DeiT's GEMMs: attention per (image, head), head_dim 64."""
    m = batch * tokens
    attention = batch * heads
    return {"patch": (1, batch * (tokens - 1), dim), "qkv": (1, m, 3 * dim),
            "qk": (attention, tokens, tokens),
            "pv": (attention, tokens, 64), "proj": (1, m, dim), "fc1": (1, m, 4 * dim), "fc2": (1, m, dim),
            "head": (1, batch, classes)}


def test_sm_counts():
    assert sm_count(make_target("cuda", "sm_90")) == H100
    assert sm_count(make_target("cuda", "sm_80")) == 108
    assert sm_count(make_target("cuda", "sm_75")) == 108  # not in the table: the default


def test_every_tile_loads_and_stores_whole_vectors():
    """Each thread moves whole vectors: the A and B slices (rows x 16, cols x 16 int8) over the block's
    threads, a warp's accumulators over its lanes; largest tile first."""
    for t in TILES:
        assert (t.rows * 16) % (t.threads * LOAD_VECTOR) == 0, t
        assert (t.cols * 16) % (t.threads * LOAD_VECTOR) == 0, t
        assert (256 * t.frags[0] * t.frags[1]) % (WARP * STORE_VECTOR) == 0, t
    areas = [t.rows * t.cols for t in TILES]
    assert areas == sorted(areas, reverse=True) and str(TILES[0]) == "128x128"


@pytest.mark.parametrize("batch", [8, 64])
@pytest.mark.parametrize("model", ["tiny", "small"])
def test_deit_gemm_grids_fill_an_h100(model, batch):
    """Every DeiT-Tiny/Small GEMM at batch 8 and 64 gets at least one block per SM except the head (M = batch
    rows: at most 63 blocks with 16x16 tiles), and no tile is wider than N = 64 for P·V."""
    dim, heads = {"tiny": (192, 3), "small": (384, 6)}[model]
    for name, (b, m, n) in deit_gemms(batch, dim, heads).items():
        tile = choose_tile(b, m, n, H100)
        assert tile.rows <= max_edge(m) and tile.cols <= max_edge(n), (name, tile)
        if name != "head":
            assert tile.grid(b, m, n) >= H100, (name, tile, tile.grid(b, m, n))
    assert choose_tile(*deit_gemms(batch, dim, heads)["pv"], H100).cols == 64


def test_tile_choice_examples():
    """P·V (N = 64) on a 64-wide tile, a batch-8 head on 16 rows, a big GEMM on 128x128, the old 128x128
    grids of DeiT-Tiny at batch 8 (26-96 blocks) now >= 132."""
    assert str(choose_tile(96, 197, 64, H100)) == "128x64"  # 8 images x 12 heads
    assert str(choose_tile(48, 197, 64, H100)) == "64x64"  # 128x64 would give 96 blocks
    assert choose_tile(1, 8, 1000, H100).rows == 16 and choose_tile(1, 8, 10, H100) == Tile((1, 1), (1, 1))
    assert str(choose_tile(1, 64 * 197, 768, H100)) == "128x128"
    assert str(choose_tile(96, 197, 197, H100)) == "128x128"
    for n in (192, 576, 768):
        assert Tile((2, 4), (4, 2)).grid(1, 1576, n) < H100 <= choose_tile(1, 1576, n, H100).grid(1, 1576, n)


def gemm_func(batch: int, m: int, k: int, n: int, dtype: str):
    """``y[b] = int8((a[b] @ b[b]) >> SHIFT)`` on ``dtype`` operands (a 2-D GEMM when ``batch`` is 0), with
    the int32 product narrowed in an epilogue block, as in a fused Relax GEMM."""
    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, m, k), dtype, name="a")
    b = te.placeholder((*lead, k, n), dtype, name="b")
    r = te.reduce_axis((0, k), name="k")

    def product(*idx):
        *s, i, j = idx
        return te.sum(a[(*s, i, r)].astype("int32") * b[(*s, r, j)].astype("int32"), axis=r)

    acc = te.compute((*lead, m, n), product, name="gemm")
    y = te.compute((*lead, m, n), lambda *idx: (acc[idx] >> SHIFT).astype("int8"), name="narrow")
    return te.create_prim_func([a, b, y]).with_attr("global_symbol", "matmul")


#: (batch, M, K, N, dtype, expected tile on an H100): DeiT-Tiny batch-8 GEMMs (P·V and Q·Kᵀ per image and
#: head: 24 of them; QKV; the head), and fc1 at batch 64
CASES = {
    "pv_u8": (24, 197, 197, 64, "uint8", "32x64"),
    "qk_s8": (24, 197, 64, 197, "int8", "128x64"),
    "qkv_s8": (0, 1576, 192, 576, "int8", "64x64"),
    "head_s8": (0, 8, 192, 1000, "int8", "16x16"),
    "fc1_b64_s8": (0, 64 * 197, 192, 768, "int8", "128x128"),
}


def _build(func, dtype: str, arch: str, tile: Tile | None = None):
    """Built for cuda: through :func:`gpu_schedules` (recording the grid), or with ``tile`` forced."""
    tgt = make_target("cuda", arch)
    if tile is not None:
        mod = schedule_tc_gemm(func, dtype, tgt, cuda.register_u8_wmma(), tile).mod
        return tvm.compile(mod, target=tgt), None
    with tgt, cuda.record_launch_grids() as grids:
        mod = cuda.gpu_schedules()(tvm.IRModule({"matmul": func}))
    return tvm.compile(mod, target=tgt), grids


def _check_wmma(executable, dtype: str, arch: str):
    (source,) = cuda.cuda_sources(executable)
    (kernel,) = kernels(source).values()
    counts = cuda.int8_instructions(cuda.to_ptx(source, arch))
    assert counts.get(WMMA[dtype], 0) > 0, counts
    assert not [i for i in counts if ("mma.sync" in i and i != WMMA[dtype]) or "dp4a" in i], counts
    assert kernel.stored_types() == {"signed char"}  # the int32 accumulator never reaches global memory


@needs_nvcc
@pytest.mark.parametrize("case", sorted(CASES))
def test_deit_shaped_gemm_tiles(case):
    """Through the default rules on sm_90: the expected tile's grid and threads in the scheduled TIR, wmma
    of the operand type in the PTX, int8 stored."""
    batch, m, k, n, dtype, expected = CASES[case]
    executable, grids = _build(gemm_func(batch, m, k, n, dtype), dtype, "sm_90")
    tile = choose_tile(max(batch, 1), m, n, H100)
    assert str(tile) == expected
    assert grids == {"matmul": [(tile.grid(max(batch, 1), m, n), tile.threads)]}
    assert gemm_blocks(["matmul"], grids) == [tile.grid(max(batch, 1), m, n)]
    _check_wmma(executable, dtype, "sm_90")


#: one small GEMM per tile: M and N not multiples of the tile (padding), K = 48 (three K steps)
TILE_GEMM = (0, 150, 48, 140)


#: every tile on int8, the largest, a middle and the smallest on uint8 (the same schedule, other intrinsics)
TILE_DTYPES = [(t, "int8") for t in TILES] + [(TILES[i], "uint8") for i in (0, 3, -1)]


@needs_nvcc
@pytest.mark.parametrize(("tile", "dtype"), TILE_DTYPES, ids=lambda x: str(x))
def test_every_tile_builds_on_wmma(tile, dtype):
    executable, _ = _build(gemm_func(*TILE_GEMM, dtype), dtype, "sm_80", tile)
    _check_wmma(executable, dtype, "sm_80")


def _gpu_arch() -> str:
    major, minor = tvm.cuda(0).compute_version.split(".")
    return f"sm_{major}{minor}"


def _run_bitexact(func, dtype: str, shape, tile: Tile | None):
    batch, m, k, n = shape
    executable, _ = _build(func, dtype, _gpu_arch(), tile)
    info, rng, dev = np.iinfo(dtype), np.random.default_rng(0), tvm.cuda(0)
    lead = (batch,) if batch else ()
    a = rng.integers(info.min, info.max, (*lead, m, k), endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, (*lead, k, n), endpoint=True).astype(dtype)
    expected = ((a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32) >> SHIFT).astype(np.int8)
    out = tvm.runtime.tensor(np.zeros_like(expected), dev)
    executable["matmul"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), out)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.gpu
@pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("tile", TILES, ids=str)
def test_every_tile_bitexact_on_gpu(tile, dtype):
    _run_bitexact(gemm_func(*TILE_GEMM, dtype), dtype, TILE_GEMM, tile)


@pytest.mark.gpu
@pytest.mark.skipif(not tvm.cuda(0).exist, reason="no CUDA device")
@pytest.mark.parametrize("case", sorted(CASES))
def test_deit_shaped_gemm_bitexact_on_gpu(case):
    batch, m, k, n, dtype, _ = CASES[case]
    _run_bitexact(gemm_func(batch, m, k, n, dtype), dtype, (batch, m, k, n), None)


def test_llvm_is_unaffected():
    """The rule (and so the tile schedule) declines non-cuda targets and pre-tensor-core GPUs; llvm builds
    never run the GPU rules (their GEMMs: cpu_gemm.py, checked bit for bit in test_cpu_int8.py)."""
    func = gemm_func(0, 64, 64, 64, "int8")
    assert cuda.Int8TensorCoreMatmul().apply(func, make_target("llvm"), False) is None
    assert cuda.Int8TensorCoreMatmul().apply(func, make_target("cuda", "sm_70"), False) is None
    assert cuda.Int8TensorCoreMatmul().apply(func, make_target("cuda", "sm_90"), False) is not None


@needs_nvcc
@pytest.mark.parametrize("how", ["failure", "env"])
def test_dlight_fallback(how, monkeypatch):
    """Where our schedule raises (or IVIT_CUDA_TC_SCHEDULE=dlight), dlight's 128x128 rule (16 warps) takes
    the GEMM, still on wmma."""
    if how == "env":
        monkeypatch.setenv(cuda.SCHEDULE_ENV, "dlight")
    else:
        def fail(*_args, **_kwargs):
            raise RuntimeError("no schedule")

        monkeypatch.setattr(cuda, "schedule_tc_gemm", fail)
    executable, grids = _build(gemm_func(0, 1576, 192, 576, "int8"), "int8", "sm_90")
    assert grids == {"matmul": [(13 * 5, 512)]}
    _check_wmma(executable, "int8", "sm_90")
