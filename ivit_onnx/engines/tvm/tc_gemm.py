"""CUDA: our 8-bit tensor-core GEMM schedule, with a block tile chosen per GEMM so its grid fills the GPU.

dlight's int8 rule has one block tile, 128x128 (16 warps): DeiT's GEMMs at batch 8 get 26-96 thread
blocks on a 132-SM H100 and P·V (N = 64) pads half of each tile. Here the block tile is a warp grid times
per-warp wmma m16n16k16 tiles (:data:`TILES`, 128x128 down to 16x16), and :func:`choose_tile` takes, per
GEMM, the largest tile that pads neither M nor N much beyond 16 (:func:`max_edge`: N = 64 gets a 64-wide
tile, M = 8 a 16-row one) and whose grid has at least one block per SM (:func:`sm_count`); when none
fills the GPU, the one giving the most blocks. The rest is as in the rule it replaces: K tile 16,
operands staged in ``shared.dyn`` with their producer blocks (input quantize, slices, transposes:
:mod:`.prologue`) inlined into the loads, no software pipelining, the accumulator stored through
``shared.dyn`` with the epilogue inlined after it (guarded: padded rows and columns are never written).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.matmul import (
    auto_inline_consumer_chain,
    auto_inline_producers,
    get_index_map,
    get_reduction_blocks,
)

WMMA = 16  # m16n16k16
WARP = 32
#: wmma K steps per shared-memory stage (K tile 16 x K_STEPS)
K_STEPS = 1
#: int8 elements per thread per vector access in the shared-memory loads (4 bytes: one 32-bit word)
LOAD_VECTOR = 4
#: int32 accumulators per thread per vector access in the epilogue's shared -> global copy
STORE_VECTOR = 4

#: CUDA's limit on gridDim.y and gridDim.z (the M tiles and the GEMM batch)
MAX_GRID_YZ = 65535
#: streaming multiprocessors by compute capability (A100 108, H100 SXM 132); any other arch: DEFAULT_SMS
SMS = {80: 108, 90: 132}
DEFAULT_SMS = 108
#: a tile edge is allowed if it pads M (or N) at most this much more than a 16-wide edge would
PAD_SLACK = 1.25


@dataclass(frozen=True)
class Tile:
    """A block tile: ``warps`` (rows, cols) warps, each computing ``frags`` (rows, cols) wmma tiles."""

    warps: tuple[int, int]
    frags: tuple[int, int]

    @property
    def rows(self) -> int:
        return WMMA * self.warps[0] * self.frags[0]

    @property
    def cols(self) -> int:
        return WMMA * self.warps[1] * self.frags[1]

    @property
    def threads(self) -> int:
        return WARP * self.warps[0] * self.warps[1]

    def grid(self, batch: int, m: int, n: int) -> int:
        """Thread blocks of a ``batch`` x M x N GEMM."""
        return batch * ceil(m / self.rows) * ceil(n / self.cols)

    def padded(self, batch: int, m: int, n: int) -> int:
        """Output elements the padded GEMM computes."""
        return batch * ceil(m / self.rows) * self.rows * ceil(n / self.cols) * self.cols

    def __str__(self) -> str:
        return f"{self.rows}x{self.cols}"


#: block tiles, largest first; each thread loads whole LOAD_VECTORs of both 16-wide K slices (see _fetch)
TILES = (
    Tile((2, 4), (4, 2)),  # 128x128, 8 warps of 64x32
    Tile((2, 2), (4, 2)),  # 128x64
    Tile((2, 2), (2, 4)),  # 64x128
    Tile((2, 2), (2, 2)),  # 64x64
    Tile((1, 2), (2, 2)),  # 32x64
    Tile((2, 1), (2, 2)),  # 64x32
    Tile((2, 2), (1, 1)),  # 32x32
    Tile((1, 2), (1, 2)),  # 16x64
    Tile((1, 1), (1, 1)),  # 16x16
)


def sm_version(target: tvm.target.Target) -> int:
    """The compute capability in the target's ``arch`` (``sm_90`` -> 90), else -1."""
    digits = str(target.attrs.get("arch", "")).replace("sm_", "")
    return int(digits) if digits.isdigit() else -1


def sm_count(target: tvm.target.Target) -> int:
    """SMs of the target's GPU, by its ``arch`` (:data:`SMS`, else :data:`DEFAULT_SMS`)."""
    return SMS.get(sm_version(target), DEFAULT_SMS)


def max_edge(extent: int) -> int:
    """The largest tile edge (16..128) for a GEMM extent that pads it at most :data:`PAD_SLACK` times as
    much as the 16-wide wmma tile does (197 -> 128: 256 vs 208; 64 -> 64; 192 -> 64; 10 -> 16)."""
    least = ceil(extent / WMMA) * WMMA
    return max(e for e in (16, 32, 64, 128) if ceil(extent / e) * e <= PAD_SLACK * least)


def choose_tile(batch: int, m: int, n: int, sms: int) -> Tile:
    """The block tile of a ``batch`` x M x N GEMM: of the tiles within :func:`max_edge` of M and N, the
    largest whose grid has at least ``sms`` blocks, else the one with the most blocks."""
    fits = [t for t in TILES if t.rows <= max_edge(m) and t.cols <= max_edge(n)]
    filling = [t for t in fits if t.grid(batch, m, n) >= sms]
    return filling[0] if filling else max(fits, key=lambda t: t.grid(batch, m, n))


def gemm_extents(sch: s_tir.Schedule, block) -> tuple[int, int, int, int]:
    """(batch, M, N, K) of a block already normalized to ``C[S, I, J] += A[S, I, K] * B[S, J, K]``."""
    return tuple(int(sch.get(loop).extent) for loop in sch.get_loops(block))


def _intrinsics(u8: dict | None) -> dict[str, str]:
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    group = get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared.dyn", in_dtype="int8",
                                  out_dtype="int32", trans_b=True)
    return {**group, **(u8 or {})}


def _fetch(sch, block, operand: int, k_loop, tile: Tile):
    """Stage ``operand`` of the block in shared memory once per K step, all threads loading vectors."""
    stage = sch.cache_read(block, operand, "shared.dyn")
    sch.compute_at(stage, k_loop)
    fused = sch.fuse(*sch.get_loops(stage)[-2:])
    _, ty, tx, vec = sch.split(fused, factors=[None, tile.warps[0] * tile.warps[1], WARP, LOAD_VECTOR])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)
    sch.annotate(stage, "tirx.manifest_shared_memory_local_stage", 1)
    return stage


def _tensorize_16x16(sch, block, intrin: str) -> None:
    """Split the block's two innermost loops into 16x16 pieces and map each piece to ``intrin``."""
    i, j = sch.get_loops(block)[-2:]
    i0, i1 = sch.split(i, factors=[None, WMMA])
    j0, j1 = sch.split(j, factors=[None, WMMA])
    sch.reorder(i0, j0, i1, j1)
    sch.unroll(i0)
    sch.unroll(j0)
    sch.tensorize(i1, intrin)


def schedule_tc_gemm(func: tvm.tirx.PrimFunc, dtype: str, target: tvm.target.Target,
                     u8_intrinsics: dict | None = None, tile: Tile | None = None) -> s_tir.Schedule:
    """The schedule of an 8-bit GEMM PrimFunc (its first reduction block; ``dtype`` int8 or uint8, whose
    wmma intrinsics ``u8_intrinsics`` names) on wmma with ``tile`` (default :func:`choose_tile`). Raises
    on anything it cannot schedule."""
    sch = s_tir.Schedule(func)
    gemm = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))[0]
    intrin = _intrinsics(u8_intrinsics if dtype == "uint8" else None)

    # C[S, I, J] += A[S, I, K] * B[S, J, K] on reindexed operand and result buffers
    reindexed = [sch.reindex(gemm, ("read", i)) for i in (0, 1)] + [sch.reindex(gemm, ("write", 0))]
    gemm_map, a_map, b_map, c_map = get_index_map(sch.get(gemm))
    sch.transform_layout(reindexed[0], ("write", 0), a_map)
    sch.transform_layout(reindexed[1], ("write", 0), b_map)
    sch.transform_layout(reindexed[2], ("read", 0), c_map)
    sch.transform_block_layout(gemm, gemm_map)
    batch, m, n, _k = gemm_extents(sch, gemm)
    tile = tile or choose_tile(batch, m, n, sm_count(target))
    if max(batch, ceil(m / tile.rows)) > MAX_GRID_YZ:
        raise ValueError(f"grid of {batch} x {ceil(m / tile.rows)} blocks exceeds CUDA's y/z limit")
    sch.pad_einsum(gemm, [1, tile.rows, tile.cols, WMMA * K_STEPS])

    # grid: (N tiles, M tiles, batch); warps: (rows, cols) of the tile; one wmma K step per iteration
    s, i, j, k = sch.get_loops(gemm)
    i, i16 = sch.split(i, factors=[None, WMMA])
    j, j16 = sch.split(j, factors=[None, WMMA])
    k, k16 = sch.split(k, factors=[None, WMMA])
    sch.reorder(i, j, k, i16, j16, k16)
    mma = sch.blockize(i16)
    bi, wi, fi = sch.split(i, factors=[None, tile.warps[0], tile.frags[0]])
    bj, wj, fj = sch.split(j, factors=[None, tile.warps[1], tile.frags[1]])
    k, k_step = sch.split(k, factors=[None, K_STEPS])
    sch.reorder(bi, bj, wi, wj, k, k_step, fi, fj)
    sch.bind(s, "blockIdx.z")
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    warp = sch.fuse(wi, wj)
    sch.bind(warp, "threadIdx.y")

    for operand in (0, 1):
        auto_inline_producers(sch, _fetch(sch, mma, operand, k, tile))
    frag_a = sch.cache_read(mma, 0, "wmma.matrix_a")
    frag_b = sch.cache_read(mma, 1, "wmma.matrix_b")
    sch.compute_at(frag_a, k_step)
    sch.compute_at(frag_b, k_step)

    # accumulators -> shared -> epilogue -> global, per warp
    acc_shared = sch.cache_write(mma, 0, "shared.dyn")
    acc = sch.cache_write(mma, 0, "wmma.accumulator")
    sch.reverse_compute_at(acc, warp)
    sch.reverse_compute_at(acc_shared, warp)
    init = sch.get_child_blocks(sch.decompose_reduction(mma, k))[0]

    _tensorize_16x16(sch, frag_a, intrin["load_a"])
    _tensorize_16x16(sch, frag_b, intrin["load_b"])
    _tensorize_16x16(sch, acc, intrin["store"])
    sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
    sch.tensorize(sch.get_loops(gemm)[-3], intrin["compute"])

    auto_inline_consumer_chain(sch, acc_shared)
    fused = sch.fuse(*sch.get_loops(acc_shared)[-2:])
    _, tx, vec = sch.split(fused, factors=[None, WARP, STORE_VECTOR])
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)
    return sch


def launch_grids(mod: tvm.IRModule) -> dict[str, list[tuple[int, int]]]:
    """(thread blocks, threads per block) of each kernel of each scheduled PrimFunc, by function name: the
    products of the ``blockIdx``/``threadIdx`` extents of each outermost thread-bound loop nest."""
    grids = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            found = _kernel_grids(func.body)
            if found:
                grids[gvar.name_hint] = found
    return grids


def gemm_blocks(gemm_calls, grids: dict) -> list[int]:
    """Thread blocks of each GEMM call (``Proxies.gemm_calls`` entries or names) with a recorded grid
    (:func:`launch_grids`): its function's largest kernel launch."""
    names = [c if isinstance(c, str) else c[0] for c in gemm_calls]
    return [max(b for b, _t in grids[n]) for n in names if grids.get(n)]


#: statement fields that hold statements (TVM 0.27 exposes no TIR visitor to Python)
_CHILDREN = ("body", "seq", "then_case", "else_case", "block", "init")


def _walk(stmt, visit) -> None:
    """Pre-order over ``stmt``'s statements; ``visit`` returning False skips a node's children."""
    if stmt is None or not visit(stmt):
        return
    for name in _CHILDREN:
        child = getattr(stmt, name, None)
        for c in child if isinstance(child, Sequence) else [child]:
            if isinstance(c, tvm.tirx.Stmt):
                _walk(c, visit)


def _bound(node, prefix: str):
    """The thread tag of a loop bound to ``prefix``* (blockIdx, threadIdx), else None."""
    if isinstance(node, tvm.tirx.For) and node.thread_binding is not None:
        tag = str(node.thread_binding.thread_tag)
        return tag if tag.startswith(prefix) else None
    return None


def _kernel_grids(body) -> list[tuple[int, int]]:
    kernels = []

    def extents(nest) -> tuple[int, int]:
        sizes: dict[str, int] = {}

        def visit(node) -> bool:
            tag = _bound(node, "blockIdx") or _bound(node, "threadIdx")
            if tag and isinstance(node.extent, tvm.tirx.IntImm):
                sizes.setdefault(tag, int(node.extent))
            return True

        _walk(nest, visit)
        blocks = threads = 1
        for tag, size in sizes.items():
            if tag.startswith("blockIdx"):
                blocks *= size
            else:
                threads *= size
        return blocks, threads

    def outer(node) -> bool:  # False: a kernel's outermost grid loop, not descended into further
        if _bound(node, "blockIdx"):
            kernels.append(extents(node))
            return False
        return True

    _walk(body, outer)
    return kernels


__all__ = ["DEFAULT_SMS", "SMS", "TILES", "Tile", "choose_tile", "gemm_blocks", "launch_grids", "max_edge",
           "schedule_tc_gemm", "sm_count", "sm_version"]
