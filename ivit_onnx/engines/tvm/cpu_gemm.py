"""Deterministic llvm GEMM schedules, no tuning: 8-bit GEMMs on AVX-512 VNNI (``vpdpbusd``) or AVX2
(``vpmaddwd``), FP32 on 16-wide FMA.

On llvm nothing schedules a GEMM unless meta-schedule tunes it (untuned: a serial triple loop). Before fusion,
:func:`pack_gemms` rewrites matmuls into TE GEMMs over packed operands. An 8-bit GEMM runs on the target's dot
product (:class:`Dot`, :func:`int8_dot`): one instruction adds ``group`` products into each of ``lanes`` int32
sums, B laid out ``[N/lanes, K/group, lanes, group]`` (the values one instruction reads).

- VNNI (16 x 4) multiplies uint8 by int8: int8 A becomes ``(a + 128) as uint8`` minus ``128 * colsum(B)``, a
  uint8 activation B ``b - 128`` plus ``128 * rowsum(A)`` (exact modulo 2**32, like every int32 GEMM).
- AVX2 (8 x 2) multiplies int16 pairs: both operands are widened to int16 (either signedness, no correction
  term); the two 8-bit products of a pair sum to at most 2 * 255**2, exactly. Where the target has VNNI, LLVM
  may fuse the multiply and its add into ``vpdpwssd`` (the same sums).
- ``IVIT_TVM_VNNI=0`` in the environment (read by :func:`has_vnni` only) turns VNNI off: a VNNI machine then
  runs, and tests, the AVX2 form.

LLVM marks integer adds nsw (overflow undefined); no int32 value here can overflow while K < 33026 (a sum of K
8-bit products). A constant 2-D weight is packed at compile time (FP32: ``[N/16, K, 16]``); an FP32 patch
embedding (conv2d with stride = kernel) becomes such a GEMM. Attention matmuls (two activations) pack B at run
time and pad M, N (and K to the group) with zeros to whole tiles, sliced back after. After fusion,
:func:`schedule_gemms` tiles every GEMM (register tile of up to 4 rows x 64 columns, x 16 on AVX2's 16
registers; accumulators in registers, tiles in parallel), runs the fused epilogue per tile (whole rows where
the GEMM was padded), and marks the function scheduled (tuning skips it). Leftover matmuls (a weight whose N
or K is not whole vectors or groups; targets without AVX2) get the same tiling vectorized over int32 columns,
lone integer sums a parallel loop, FP32 softmax/LayerNorm TVM's dlight CPU rule; in float models (no integer
matmul) exp/erf/tanh become TVM's fast_* approximations (GELU's erf is a scalar libm call otherwise). Only
llvm targets are touched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, s_tir, te
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.script import tirx as T

from .relax_expr import bound, const_value, int32_sum, static_shape
from .relax_expr import dtype as _dtype
from .relax_expr import is_call as _is_call

#: environment variable: ``0`` turns VNNI off on every target (the integer GEMMs take the AVX2 form)
VNNI_ENV = "IVIT_TVM_VNNI"
#: block name of the packed FP32 GEMM emitted by :func:`pack_gemms`
F32_BLOCK = "ivit_f32_gemm"
#: TVM's legalized ``relax.matmul`` block (integer matmuls no dot product takes)
MATMUL_BLOCK = "matmul"
#: register tile: rows (from the last batch axis and M) x column vectors (FP32 and leftover matmuls: 4 of 16)
TILE_ROWS, TILE_VECTORS = 4, 4


@dataclass(frozen=True)
class Dot:
    """An 8-bit dot-product instruction: ``lanes`` int32 sums, each += ``group`` products of A (``a_dtype``)
    and packed B (``b_dtype``); a register tile's row is ``vectors`` of them."""

    name: str
    lanes: int
    group: int
    a_dtype: str
    b_dtype: str
    vectors: int

    @property
    def block(self) -> str:
        """The packed GEMM's block (and function) name."""
        return f"ivit_{self.name}_gemm"


# 4 x 4 zmm accumulators (of 32); AVX2 has 16 ymm registers: 4 x 2 accumulators, B vectors, A broadcasts
VNNI = Dot("vnni", 16, 4, "uint8", "int8", 4)
AVX2 = Dot("avx2", 8, 2, "int16", "int16", 2)
DOTS = {dot.block: dot for dot in (VNNI, AVX2)}
VNNI_BLOCK = VNNI.block


def _intrin(dot: Dot):
    """(description, implementation) of one register-tile update: ``c[lanes] += a[group] . b[lanes, group]``.

    TVM 0.27's own dot_16x4_vnni does not build with its LLVM: llvm.x86.avx512.vpdpbusd.512 takes
    <64 x i8> operands ("Call parameter type does not match function signature!"); this one passes them so.
    The accumulator is a "local" buffer (the register tile), which the stock description (global) never
    matches."""
    lanes, group, a_dtype, b_dtype = dot.lanes, dot.group, dot.a_dtype, dot.b_dtype
    acc = f"int32x{lanes}"

    @T.prim_func(s_tir=True)
    def desc(a: T.Buffer((group,), a_dtype, offset_factor=1),
             b: T.Buffer((lanes, group), b_dtype, offset_factor=1),
             c: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
        with T.sblock("root"):
            T.reads(c[0:lanes], a[0:group], b[0:lanes, 0:group])
            T.writes(c[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, group):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        c[vi] = c[vi] + T.cast(a[vk], "int32") * T.cast(b[vi, vk], "int32")

    if dot.name == "vnni":
        @T.prim_func(s_tir=True)
        def impl(a: T.Buffer((group,), a_dtype, offset_factor=1),
                 b: T.Buffer((lanes, group), b_dtype, offset_factor=1),
                 c: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
            with T.sblock("root"):
                T.reads(c[0:lanes], a[0:group], b[0:lanes, 0:group])
                T.writes(c[0:lanes])
                a_u8x64 = T.reinterpret(
                    T.broadcast(T.reinterpret(a.vload([0], "uint8x4"), dtype="int32"), 16), dtype="uint8x64")
                c[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), c.vload([0], dtype=acc),
                    a_u8x64, b.vload([0, 0], dtype="int8x64"), dtype=acc)
    else:  # vpmaddwd: A's pair (int16) broadcast; each lane adds its two products exactly
        @T.prim_func(s_tir=True)
        def impl(a: T.Buffer((group,), a_dtype, offset_factor=1),
                 b: T.Buffer((lanes, group), b_dtype, offset_factor=1),
                 c: T.Buffer((lanes,), "int32", offset_factor=1, scope="local")) -> None:
            with T.sblock("root"):
                T.reads(c[0:lanes], a[0:group], b[0:lanes, 0:group])
                T.writes(c[0:lanes])
                pair = T.reinterpret(a.vload([0], "int16x2"), dtype="int32")
                c[T.ramp(T.int32(0), 1, lanes)] = c.vload([0], dtype=acc) + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx2.pmadd.wd"),
                    T.reinterpret(T.broadcast(pair, lanes), dtype="int16x16"),
                    b.vload([0, 0], dtype="int16x16"), dtype=acc)

    return desc, impl


def _intrin_name(dot: Dot) -> str:
    """The tensor intrinsic of ``dot`` (registered on first use)."""
    name = f"ivit_{dot.name}_local"
    try:
        s_tir.TensorIntrin.get(name)
    except Exception:  # noqa: BLE001 - not registered yet
        s_tir.TensorIntrin.register(name, *_intrin(dot))
    return name


def _has_feature(target: tvm.target.Target, feature: str) -> bool:
    from tvm.target.codegen import target_has_features

    with target:
        return bool(target_has_features(feature))


def has_vnni(target: tvm.target.Target) -> bool:
    """Whether ``target`` is llvm for a CPU with AVX-512 VNNI, unless ``IVIT_TVM_VNNI=0`` turns VNNI off."""
    if target.kind.name != "llvm" or os.environ.get(VNNI_ENV, "").strip() == "0":
        return False
    return _has_feature(target, "avx512vnni")


def int8_dot(target: tvm.target.Target) -> Dot | None:
    """The dot product of ``target``'s packed integer GEMMs: VNNI, else AVX2, else None (leftover tiling)."""
    if has_vnni(target):
        return VNNI
    return AVX2 if target.kind.name == "llvm" and _has_feature(target, "avx2") else None


# ---------------------------------------------------------------------------------------------- packing


def pack_dot(w: np.ndarray, dot: Dot) -> np.ndarray:
    """8-bit ``[K, N]`` -> ``dot.b_dtype`` ``[N/lanes, K/group, lanes, group]``: element
    ``[n // lanes, k // group, n % lanes, k % group] = w[k, n]``."""
    (k, n), lanes, group = w.shape, dot.lanes, dot.group
    packed = w.astype(dot.b_dtype).T.reshape(n // lanes, lanes, k // group, group).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(packed)


def pack_f32(w: np.ndarray) -> np.ndarray:
    """float32 ``[K, N]`` -> ``[N/16, K, 16]``: element ``[n//16, k, n%16] = w[k, n]``."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k, n // 16, 16).transpose(1, 0, 2))


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def _w_lead(i, w: te.Tensor, packed_dims: int) -> tuple:
    """The output's batch indices a (batched) packed operand ``w`` has: its last leading ones."""
    lead = len(w.shape) - packed_dims
    return tuple(i[:-2][len(i) - 2 - lead:]) if lead else ()


def _dot_te(a: te.Tensor, w: te.Tensor, lanes: int, group: int, name: str) -> te.Tensor:
    """int32 GEMM of ``a`` and ``w`` packed for a dot product (:func:`pack_dot`)."""
    *lead, m, kdim = a.shape
    k = te.reduce_axis((0, kdim), name="k")
    return te.compute(
        (*lead, m, w.shape[-4] * lanes),
        lambda *i: te.sum(a[(*i[:-1], k)].astype("int32") * w[(*_w_lead(i, w, 4), i[-1] // lanes, k // group,
                                                               i[-1] % lanes, k % group)].astype("int32"),
                          axis=k),
        name=name)


def _f32_te(a: te.Tensor, w: te.Tensor, mp: int | None = None) -> te.Tensor:
    """FP32 GEMM over packed ``w``; with ``mp`` > M, rows beyond M read zeros (whole tiles, no copy)."""
    *lead, m, kdim = a.shape
    k = te.reduce_axis((0, kdim), name="k")

    def row(i):
        if mp is None:
            return a[(*i[:-1], k)]
        return tvm.tirx.if_then_else(i[-2] < m, a[(*i[:-2], tvm.tirx.min(i[-2], m - 1), k)],
                                     tvm.tirx.const(0, a.dtype))

    return te.compute(
        (*lead, mp or m, w.shape[-3] * 16),
        lambda *i: te.sum(row(i) * w[(*_w_lead(i, w, 3), i[-1] // 16, k, i[-1] % 16)], axis=k),
        name=F32_BLOCK)


def _pad_te(a: te.Tensor, mp: int, kp: int, dtype: str, name: str) -> te.Tensor:
    """8-bit ``[..., M, K]`` -> ``dtype`` ``[..., mp, kp]``, zero-padded (int8 to uint8 shifts by +128, int16
    holds either as is)."""
    m, kdim, shift = a.shape[-2], a.shape[-1], 128 if (a.dtype, dtype) == ("int8", "uint8") else 0

    def elem(*i):
        value = a[(*i[:-2], tvm.tirx.min(i[-2], m - 1), tvm.tirx.min(i[-1], kdim - 1))]
        shifted = (value.astype("int32") + shift).astype(dtype)
        inside = tvm.tirx.all(i[-2] < m, i[-1] < kdim)
        return tvm.tirx.if_then_else(inside, shifted, tvm.tirx.const(0, dtype))

    return te.compute((*a.shape[:-2], mp, kp), elem, name=name)


def _pack_dot_te(b: te.Tensor, np_: int, kp: int, lanes: int, group: int, dtype: str, name: str) -> te.Tensor:
    """8-bit ``[..., K, N]`` -> ``dtype`` ``[..., np_/lanes, kp/group, lanes, group]`` (uint8 to int8 shifts
    by -128), zero-padded: the layout of :func:`pack_dot`."""
    *lead, kdim, n = b.shape
    shift = 128 if (b.dtype, dtype) == ("uint8", "int8") else 0

    def elem(*i):
        kk, nn = i[-3] * group + i[-1], i[-4] * lanes + i[-2]
        value = b[(*i[:-4], tvm.tirx.min(kk, kdim - 1), tvm.tirx.min(nn, n - 1))].astype("int32") - shift
        return tvm.tirx.if_then_else(tvm.tirx.all(kk < kdim, nn < n), value.astype(dtype),
                                     tvm.tirx.const(0, dtype))

    return te.compute((*lead, np_ // lanes, kp // group, lanes, group), elem, name=name)


def _pack_f32_te(b: te.Tensor, np_: int) -> te.Tensor:
    """Activation ``[..., K, N]`` -> ``[..., np_/16, K, 16]`` (zero-padded), the layout of pack_f32."""
    *lead, kdim, n = b.shape

    def elem(*i):
        nn = i[-3] * 16 + i[-1]
        value = b[(*i[:-3], i[-2], tvm.tirx.min(nn, n - 1))]
        return tvm.tirx.if_then_else(nn < n, value, tvm.tirx.const(0, b.dtype))

    return te.compute((*lead, np_ // 16, kdim, 16), elem, name="ivit_pack_f32")


@mutator
class _GemmPacker(PyExprMutator):
    """Matmuls by constant 2-D weights -> packed TE GEMMs; FP32 patch-embedding convs -> such GEMMs."""

    def __init__(self, mod: tvm.IRModule, dot: Dot | None):
        super().__init__(mod)
        self.dot = dot
        self.count = 0
        self.integer = False  # an integer matmul was seen: the integer model, which must stay exact

    def _const(self, expr) -> np.ndarray | None:
        return const_value(bound(self.lookup_binding, expr))

    def _dot_gemm(self, a: relax.Expr, packed: relax.Expr) -> relax.Expr:
        dot = self.dot
        return self.builder_.emit_te(_dot_te, a, packed, dot.lanes, dot.group, dot.block,
                                     primfunc_name_hint=dot.block)

    def gemm(self, a: relax.Expr, w: np.ndarray) -> relax.Expr | None:
        """``matmul(a, w)`` as a packed GEMM, or None where no packed form applies."""
        (kdim, n), dot = w.shape, self.dot
        if a.ty.ndim < 2:
            return None
        if (_dtype(a) in ("int8", "uint8") and w.dtype == np.int8 and dot is not None and n % dot.lanes == 0
                and kdim % dot.group == 0):
            self.count += 1
            packed = relax.const(pack_dot(w, dot))
            if _dtype(a) == dot.a_dtype:
                return self._dot_gemm(a, packed)
            if (_dtype(a), dot.a_dtype) != ("int8", "uint8"):  # widened (AVX2): exact
                return self._dot_gemm(self.builder_.emit(relax.op.astype(a, dot.a_dtype)), packed)
            shifted = relax.op.add(relax.op.astype(a, "int32"), relax.const(128, "int32"))
            out = self._dot_gemm(self.builder_.emit(relax.op.astype(shifted, "uint8")), packed)
            colsum = 128 * w.astype(np.int64).sum(axis=0)  # (a + 128).w = a.w + 128*colsum(w)
            return self.builder_.emit(relax.op.subtract(out, relax.const(colsum.astype(np.int32))))
        if _dtype(a) == "float32" and w.dtype == np.float32 and n % 16 == 0:
            self.count += 1
            return self.builder_.emit_te(_f32_te, a, relax.const(pack_f32(w)), primfunc_name_hint=F32_BLOCK)
        return None

    def gemm_of_activations(self, a: relax.Expr, b: relax.Expr) -> relax.Expr | None:
        """``matmul(a, b)`` of two activations with the same batch shape (attention): ``b`` packed at run
        time, both zero-padded (M to TILE_ROWS, N to 16, K to the dot product's group), the GEMM sliced back
        to M x N."""
        ashape, bshape = static_shape(a), static_shape(b)
        if ashape is None or bshape is None or len(ashape) < 3 or ashape[:-2] != bshape[:-2]:
            return None
        (m, kdim), n, dot = ashape[-2:], bshape[-1], self.dot
        mp, np_ = _ceil(m, TILE_ROWS), _ceil(n, 16)  # padded: full register tiles (197 tokens is prime)
        emit, emit_te = self.builder_.emit, self.builder_.emit_te
        if {_dtype(a), _dtype(b)} <= {"int8", "uint8"} and dot is not None:
            kp = _ceil(kdim, dot.group)
            # a.b = (a + sa).(b - sb) - sa*colsum(b) + sb*rowsum(a) + sa*sb*K: sa = 128 for int8 a where the
            # dot product takes uint8 (VNNI), sb = 128 for uint8 b where it takes int8
            sa = 128 * ((_dtype(a), dot.a_dtype) == ("int8", "uint8"))
            sb = 128 * ((_dtype(b), dot.b_dtype) == ("uint8", "int8"))
            a_in, name = a, "ivit_u8_shift" if sa else "ivit_pad_a"
            if (dot.a_dtype, mp, kp) != (_dtype(a), m, kdim):
                a_in = emit_te(_pad_te, a, mp, kp, dot.a_dtype, name, primfunc_name_hint=name)
            name = f"ivit_pack_{dot.name}"
            packed = emit_te(_pack_dot_te, b, np_, kp, dot.lanes, dot.group, dot.b_dtype, name,
                             primfunc_name_hint=name)
            out = self._dot_gemm(a_in, packed)
            terms = []
            if sa:
                terms.append(relax.op.multiply(int32_sum(b, -2), relax.const(-sa, "int32")))
            if sb:
                terms.append(relax.op.multiply(int32_sum(a, -1), relax.const(sb, "int32")))
            if sa and sb:
                terms.append(relax.const(np.int32(sa * sb * kdim)))
            fix = None
            for term in terms:
                fix = term if fix is None else relax.op.add(fix, term)
            fix = None if fix is None else emit(fix)
        elif _dtype(a) == _dtype(b) == "float32":
            packed = emit_te(_pack_f32_te, b, np_, primfunc_name_hint="ivit_pack_f32")
            out, fix = emit_te(_f32_te, a, packed, mp, primfunc_name_hint=F32_BLOCK), None
        else:
            return None
        if (mp, np_) != (m, n):
            rank = a.ty.ndim
            out = emit(relax.op.strided_slice(out, axes=[rank - 2, rank - 1], begin=[0, 0], end=[m, n]))
        self.count += 1
        return out if fix is None else emit(relax.op.add(out, fix))

    def _matmul(self, call: relax.Call) -> relax.Expr | None:
        a, b = call.args
        self.integer |= "int" in _dtype(a)
        if _dtype(call) != {"int8": "int32", "uint8": "int32"}.get(_dtype(a), _dtype(a)):
            return None
        w = self._const(b)
        if w is None:
            return self.gemm_of_activations(a, b)
        return self.gemm(a, w) if w.ndim == 2 else None

    def _patch_conv(self, call: relax.Call) -> relax.Expr | None:
        """FP32 conv2d with stride = kernel, no padding/dilation/groups -> patches x packed weight."""
        x, wexpr = call.args
        w, at = self._const(wexpr), call.attrs
        shape = static_shape(x)
        if w is None or _dtype(x) != "float32" or shape is None or len(shape) != 4:
            return None
        if str(at.data_layout) != "NCHW":
            return None
        o, c, kh, kw = w.shape
        stride, pad, dil = ([int(v) for v in at.strides], [int(v) for v in at.padding],
                            [int(v) for v in at.dilation])
        bsz, cin, h, wd = shape
        if (str(at.kernel_layout) != "OIHW" or int(at.groups) != 1 or stride != [kh, kw] or any(pad)
                or dil != [1, 1] or cin != c or h % kh or wd % kw):
            return None
        hp, wp = h // kh, wd // kw
        patches = relax.op.reshape(x, (bsz, c, hp, kh, wp, kw))
        patches = relax.op.permute_dims(patches, [0, 2, 4, 1, 3, 5])
        patches = self.builder_.emit(relax.op.reshape(patches, (bsz, hp * wp, c * kh * kw)))
        out = self.gemm(patches, np.ascontiguousarray(w.reshape(o, -1).T))
        if out is None:
            return None
        return relax.op.reshape(relax.op.permute_dims(out, [0, 2, 1]), (bsz, o, hp, wp))

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        new = None
        if _is_call(call, "relax.matmul") and len(call.args) == 2:
            new = self._matmul(call)
        elif _is_call(call, "relax.nn.conv2d"):
            new = self._patch_conv(call)
        return call if new is None else new


def pack_gemms(mod: tvm.IRModule, target: tvm.target.Target) -> tuple[tvm.IRModule, int]:
    """Before fusion, for llvm: matmuls (and FP32 patch convs) as packed TE GEMMs, 8-bit ones on the target's
    dot product (:func:`int8_dot`, module docstring); returns the module and how many were rewritten. Other
    targets: unchanged, 0."""
    if target.kind.name != "llvm":
        return mod, 0
    packer = _GemmPacker(mod, int8_dot(target))
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            packer.builder_.update_func(gv, packer.visit_expr(func))
    new = relax.transform.CanonicalizeBindings()(packer.builder_.get())
    if not packer.integer:  # float models only: fast_exp/fast_erf are vectorizable (erf: a libm call per
        new = relax.transform.FastMathTransform()(new)  # element); an integer model's float ops stay exact
    return relax.transform.DeadCodeElimination()(new), packer.count


# -------------------------------------------------------------------------------------------- scheduling


def _divisor(extent: int, limit: int) -> int:
    return next(d for d in range(min(limit, extent), 0, -1) if extent % d == 0)


def _row_tile(sch, loops, m_extent: int, shared_b: bool) -> tuple[int, int]:
    """(rows from the last batch axis, rows from M): up to TILE_ROWS, dividing their extents. M = 197 tokens
    is prime: the batch axis supplies the rows then, where all batches share the B operand (a weight)."""
    tm = _divisor(m_extent, TILE_ROWS)
    if tm >= TILE_ROWS // 2 or len(loops) < 4 or not shared_b:
        return 1, tm
    return _divisor(int(sch.get(loops[-4]).extent), TILE_ROWS // tm), tm


def _block_named(sch, names):
    for block in sch.get_child_blocks(_root(sch)):
        if sch.get(block).name_hint in names:
            return block
    return None


def _root(sch):
    from tvm.s_tir.dlight.analysis import get_root_block

    return get_root_block(sch)


def _fuse_epilogue(sch, gemm) -> bool:
    """Inline every block but the GEMM and the output into its consumer; False if that is impossible
    (a prologue before a dot-product GEMM, which must read its operands as they are; several outputs; a
    block that is not elementwise). An FP32 GEMM's prologue (slicing its operand out of the QKV tensor) is
    inlined."""
    blocks = list(sch.get_child_blocks(_root(sch)))
    if not sch.get(blocks[0]).same_as(sch.get(gemm)) and sch.get(gemm).name_hint in DOTS:
        return False
    outputs = sch.get_output_blocks(_root(sch))
    if len(outputs) != 1:
        return False
    for block in blocks:
        if not sch.get(block).same_as(sch.get(outputs[0])) and not sch.get(block).same_as(sch.get(gemm)):
            try:
                sch.compute_inline(block)
            except Exception:  # noqa: BLE001 - not inlinable: this function keeps TVM's default
                return False
    return True


def _extents(block) -> list[int]:
    return [int(iv.dom.extent) for iv in block.iter_vars]


def _schedule(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc | None:
    sch = s_tir.Schedule(func)
    gemm = _block_named(sch, (*DOTS, F32_BLOCK, MATMUL_BLOCK))
    if gemm is None or not _fuse_epilogue(sch, gemm):
        return None
    block = sch.get(gemm)
    kind, written = block.name_hint, block.writes[0].source
    dot = DOTS.get(kind)
    operands = [r.source for r in block.reads if not r.source.same_as(written)]
    # B is shared by every row (a weight) unless it has batch axes of its own
    shared_b = len(operands[-1].shape) == (4 if dot else 3 if kind == F32_BLOCK else 2)
    output = sch.get_output_blocks(_root(sch))[0]
    epilogue = None if sch.get(output).same_as(block) else output
    writeback = sch.cache_write(gemm, 0, "local")
    if epilogue is not None and _extents(sch.get(epilogue)) == _extents(block)[:-1]:
        sch.reverse_compute_inline(epilogue)  # per element of the write-back (same domain)
        epilogue = None
    loops = sch.get_loops(gemm)
    if len(loops) < 3 or not all(isinstance(sch.get(lp).extent, tvm.tirx.IntImm) for lp in loops):
        return None
    *lead, m, n, k = loops
    n_ext, m_ext, k_ext = (int(sch.get(lp).extent) for lp in (n, m, k))
    lanes = dot.lanes if dot else 16 if kind == F32_BLOCK else _divisor(n_ext, 16)
    if n_ext % lanes or (dot and k_ext % dot.group):
        return None
    nj = _divisor(n_ext // lanes, dot.vectors if dot else TILE_VECTORS)
    n_o, n_j, n_v = sch.split(n, [None, nj, lanes])
    if dot:
        k_o, k_i = sch.split(k, [None, dot.group])
        sch.reorder(m, n_o, k_o, n_j, n_v, k_i)
        body = sch.blockize(n_v)
    else:
        k_o = k
        sch.reorder(m, n_o, k_o, n_j, n_v)
        if lanes > 1:  # (a leftover matmul with N prime has scalar columns)
            sch.vectorize(n_v)
        body = gemm
    tb, tm = _row_tile(sch, [*lead, m, n, k], m_ext, shared_b)
    m_o, m_i = sch.split(m, [None, tm])
    if tb > 1:
        b_o, b_i = sch.split(lead[-1], [None, tb])
        outer, rows = [*lead[:-1], b_o, m_o, n_o], [b_i, m_i]
    else:
        outer, rows = [*lead, m_o, n_o], [m_i]
    sch.reorder(*outer, k_o, *rows, n_j)
    if epilogue is None:
        anchor = tile = sch.fuse(*outer)
    else:  # parallel over row tiles only: the epilogue runs on whole rows, vectorized without a remainder
        anchor, tile = sch.fuse(*outer[:-1]), outer[-1]
    sch.parallel(anchor)
    sch.reverse_compute_at(writeback, tile)
    if epilogue is not None:  # a smaller domain (the GEMM was padded): per row tile, after its columns
        sch.reverse_compute_at(epilogue, anchor)
        sch.vectorize(sch.get_loops(epilogue)[-1])
    init = sch.decompose_reduction(body, k_o)
    for lp in (*rows, n_j):
        sch.unroll(lp)
    if dot:
        sch.tensorize(body, _intrin_name(dot))
        init = sch.get_child_blocks(init)[0]
    if lanes > 1:  # (else a 1-row tile of scalar columns has no loop of its own left)
        sch.vectorize(sch.get_loops(init)[-1])
        _, vec = sch.split(sch.get_loops(writeback)[-1], [None, lanes])
        sch.vectorize(vec)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _is_sum(func: tvm.tirx.PrimFunc) -> bool:
    """Whether ``func``'s output block is its only reduction (e.g. cast + sum)."""
    sch = s_tir.Schedule(func)
    blocks = list(sch.get_child_blocks(_root(sch)))
    kinds = [[int(iv.iter_type) for iv in sch.get(b).iter_vars] for b in blocks]
    return all(2 not in k for k in kinds[:-1]) and 2 in kinds[-1] and len(blocks) <= 3


def _schedule_sum(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc | None:
    """A lone integer sum (the row/column sums of the zero-point fixes): leading axes in parallel, the
    reduction inside, the summed-over axis innermost unless it is the last one (then the last spatial)."""
    sch = s_tir.Schedule(func)
    blocks = list(sch.get_child_blocks(_root(sch)))
    red = blocks[-1]
    iters = sch.get(red).iter_vars
    kinds = [int(iv.iter_type) for iv in iters]  # 0 data parallel, 2 reduction
    if "int" not in str(sch.get(red).writes[0].source.dtype) or kinds.count(2) != 1:
        return None
    try:
        for block in blocks[:-1]:
            sch.compute_inline(block)
    except Exception:  # noqa: BLE001 - not a cast/elementwise prologue
        return None
    loops = sch.get_loops(red)
    (r,) = [lp for lp, kind in zip(loops, kinds, strict=True) if kind == 2]
    spatial = [lp for lp, kind in zip(loops, kinds, strict=True) if kind == 0]
    if kinds[-1] == 2:
        sch.parallel(sch.fuse(*spatial))
    else:
        inner = spatial[-1]
        sch.reorder(*spatial[:-1], r, inner)
        sch.parallel(sch.fuse(*spatial[:-1]))
        init = sch.decompose_reduction(red, r)
        sch.vectorize(inner)
        sch.vectorize(sch.get_loops(init)[-1])
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def schedule_gemms(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """After fusion, for llvm: schedule every fused GEMM (see the module docstring) and, with dlight's CPU
    reduction rule, the float reductions; functions already scheduled (row kernels) are left alone."""
    if target.kind.name != "llvm":
        return mod
    from tvm.s_tir import dlight as dl

    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and not (func.attrs and func.attrs.get("tirx.is_scheduled")):
            scheduled = _schedule(func)
            if scheduled is None and _is_sum(func):
                scheduled = _schedule_sum(func)
            if scheduled is not None:
                updates[gv] = scheduled
    for gv, func in updates.items():
        mod[gv] = func
    with target:
        return dl.ApplyDefaultSchedule(dl.cpu.Reduction())(mod)


def llvm_asm(executable) -> str:
    """The assembly of a compiled llvm module's kernels (``tvm.compile``'s executable)."""
    mod = getattr(executable, "mod", executable)
    return "".join(m.inspect_source("asm") for m in mod.imports if m.kind == "llvm")


__all__ = ["AVX2", "F32_BLOCK", "VNNI", "VNNI_BLOCK", "VNNI_ENV", "Dot", "has_vnni", "int8_dot",
           "llvm_asm", "pack_dot", "pack_f32", "pack_gemms", "schedule_gemms"]
