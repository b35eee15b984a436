"""Shiftmax, ILayerNorm, L1LayerNorm, IL2Norm: one kernel per op, reductions over the row, a division per row.

The compute (``te``) is written as stages: row reductions (``max``, ``sum``), per-row scalars (the
reciprocal ``floor((2**62-1)/sum)``; the mean, ``isqrt`` and ``floor(2**61/r)``), full-size intermediates
recomputed where read (the shift-exp, the centred value) and the output. :func:`schedule` turns it into
one kernel: on cuda a thread block per row, reductions across its threads (warp shuffles + shared memory,
TVM's cross-thread reduction), per-row scalars computed by every thread in registers (one division per
row and thread, none per element); on llvm rows in parallel, each row's stages in its own loop.
int32 where the stated bounds allow: the row max, the shift-exp (:func:`.arith.exp_dtype`), the centred
value of ILayerNorm and IL2Norm (``|d| < 2**31`` by their precondition ``C * max|d|**2 < 2**62``) and
ILayerNorm's ``sum(x)`` for int8/int16 rows; the exp sum and the variance are int64 (``< 2**62``).
"""

from __future__ import annotations

from tvm import s_tir, te, tirx
from tvm.s_tir.dlight.analysis import get_root_block

from .arith import (
    I32,
    I64,
    RECIP_M,
    at,
    bits_of,
    const,
    int_div,
    isqrt_stages,
    let,
    round_shift,
    saturate,
    shift_exp,
    wide,
)
from .elementwise import requantize

#: attribute marking a row kernel for :func:`schedule` (value: the op type)
KERNEL_ATTR = "ivit.row_kernel"


def _row(i):
    return i[:-1]


def row_exps(x, exp_of_d):
    """``(exp, sum)`` of a softmax over the last axis: ``exp(*i)`` the expression ``exp_of_d(x[i] - row max)``
    (int64, recomputed where read), ``sum`` its row sums (a reduction stage)."""
    rows, length = list(x.shape[:-1]), x.shape[-1]
    k = te.reduce_axis((0, length), "k")
    mx = te.compute(rows, lambda *r: te.max(x[r + (k,)].astype(I32), axis=k), name="row_max")

    def exp(*i):
        return exp_of_d(wide(x[i]) - wide(mx[_row(i)]))

    k2 = te.reduce_axis((0, length), "k2")
    return exp, te.compute(rows, lambda *r: te.sum(exp(*r, k2), axis=k2), name="row_sum")


def int_softmax(x, zy, exp_of_d, *, bits: int, row_sum: bool, name: str):
    """``int_div(e, sum(e), bits) + zy`` over the last axis for ``e = exp_of_d(x - max)`` (Shiftmax's output
    stage, also IBertSoftmax's); with ``row_sum``, ``[y, sum(y) over the row]`` (int32; what P·V's zero-point
    correction needs)."""
    shape, rows = list(x.shape), list(x.shape[:-1])
    exp, total = row_exps(x, exp_of_d)
    # uint64 (value < 2**62): TVM's StorageRewrite would otherwise reuse the sum's buffer in place, which on
    # cuda is the shared all-reduce result that other threads may still be reading (a race)
    recip = te.compute(
        rows, lambda *r: tirx.truncdiv(const(RECIP_M), total[r]).astype("uint64"), name="row_recip"
    )
    y = te.compute(
        shape,
        lambda *i: (int_div(exp(*i), wide(recip[_row(i)]), bits) + wide(at(zy, i, shape))).astype(
            str(zy.dtype)
        ),
        name=name,
    )
    return [y, output_row_sum(y)] if row_sum else y


def shiftmax(x, zy, consts=None, *, x0: int, n: int, bits: int, row_sum: bool = False):
    """``opset.shiftmax.reference`` over the last axis (``consts``: :func:`.arith.exp_constants`, or None);
    ``row_sum``: see :func:`int_softmax`."""
    return int_softmax(
        x, zy, lambda d: shift_exp(d, x0, n, consts), bits=bits, row_sum=row_sum, name="ivit_shiftmax"
    )


def output_row_sum(y: te.Tensor) -> te.Tensor:
    """int32 sums of ``y``'s rows (8-bit rows of < 2**23 elements), read back from ``y`` itself: scheduled
    after it in the same kernel, each cuda thread reading the elements it wrote (:func:`schedule`)."""
    k = te.reduce_axis((0, y.shape[-1]), "k3")
    rows = list(y.shape[:-1])
    return te.compute(rows, lambda *r: te.sum(y[r + (k,)].astype(I32), axis=k), name="y_row_sum")


def shiftmax_requantized(
    x,
    zx,
    b,
    c,
    zr,
    zy,
    consts=None,
    *,
    rq_qmin: int,
    rq_qmax: int,
    x0: int,
    n: int,
    bits: int,
    row_sum: bool = False,
):
    """``Shiftmax(Requantize(x, zx, b, c, zr), zy)`` as one row kernel: the requantized scores are recomputed
    where read (never stored), so their producer (a GEMM) writes its narrower ``x``."""
    scores = requantize(x, zx, b, c, zr, qmin=rq_qmin, qmax=rq_qmax)
    return shiftmax(scores, zy, consts, x0=x0, n=n, bits=bits, row_sum=row_sum)


def shiftmax_masked(m, fill, s, *args, mask_value: int | None, **kwargs):
    """``Shiftmax(Requantize(Where(m [== mask_value], fill, int32(s))))`` as one row kernel (``m``, ``fill``
    broadcast; ``args``, ``kwargs``: :func:`shiftmax_requantized`'s after ``x``): the masked int32 scores are
    recomputed where read from the narrow ``s`` and the mask, so the GEMM before them stores ``s`` (BERT's
    attention mask; the rule is ``passes/rules/mask.py``'s)."""
    shape = list(s.shape)

    def masked(*i):
        keep = at(m, i, shape)
        cond = keep == tirx.const(mask_value, str(m.dtype)) if mask_value is not None else keep
        return tirx.Select(cond, at(fill, i, shape).astype(I32), s[i].astype(I32))

    return shiftmax_requantized(te.compute(shape, masked, name="masked_scores"), *args, **kwargs)


def ilayernorm(x, b, c, bias, zy, *, shift_in: int, p: int, qmin: int, qmax: int) -> te.Tensor:
    """``opset.ilayernorm.reference`` over the last axis (``isqrt`` digit by digit, exact)."""
    return _layernorm(x, b, c, bias, zy, shift_in, p, qmin, qmax, l1=False)


def l1layernorm(x, b, c, bias, zy, *, shift_in: int, p: int, qmin: int, qmax: int) -> te.Tensor:
    """``opset.l1layernorm.reference`` over the last axis: ILayerNorm's kernel, ``sum|d|`` for the root."""
    return _layernorm(x, b, c, bias, zy, shift_in, p, qmin, qmax, l1=True)


def il2norm(x, zx, b, c, zy, *, shift_in: int, eps: int, p: int, qmin: int, qmax: int) -> te.Tensor:
    """``opset.il2norm.reference`` over the last axis: ILayerNorm's kernel with ``(x - zx) * 2**shift_in`` for
    the centred value, the root clamped below by ``eps`` and no bias."""
    return _layernorm(x, b, c, None, zy, shift_in, p, qmin, qmax, l1=False, zx=zx, eps=eps)


def _layernorm(x, b, c, bias, zy, shift_in: int, p: int, qmin: int, qmax: int, l1: bool, zx=None,
               eps: int | None = None) -> te.Tensor:
    """``u = floor(d * floor(2**61 / norm) / 2**(61 - p))``, then the per-channel rescale (``bias`` None: 0);
    ``norm`` is ``isqrt(max(sum(d*d), 1))`` (at least ``eps`` when given) or (``l1``) ``max(sum(|d|), 1)``;
    ``d`` centred on the row mean, or on the zero point ``zx`` when given (IL2Norm)."""
    shape, rows, length = list(x.shape), list(x.shape[:-1]), int(x.shape[-1])
    lo, hi = bits_of(x.dtype)
    sum_dt = I32 if max(-lo, hi) * length < 2**31 else I64
    # |d| < 2**31: ILayerNorm's and IL2Norm's precondition C * max|d|**2 < 2**62; L1LayerNorm's only bounds
    # C * max|d|
    d_dt = I32 if not l1 or (2 * max(-lo, hi) + 1) << shift_in < 2**31 else I64
    scale_in = const(1 << shift_in)
    if zx is None:
        k = te.reduce_axis((0, length), "k")
        sx = te.compute(rows, lambda *r: te.sum(x[r + (k,)].astype(sum_dt), axis=k), name="row_sum")
        mean = te.compute(
            rows, lambda *r: tirx.floordiv(wide(sx[r]) * scale_in, const(length)), name="row_mean"
        )

        def centre(i):
            return mean[_row(i)]
    else:

        def centre(i):
            return wide(at(zx, i, shape)) * scale_in

    def d(*i):
        return (wide(x[i]) * scale_in - centre(i)).astype(d_dt)

    k2 = te.reduce_axis((0, length), "k2")
    if l1:
        total = te.compute(rows, lambda *r: te.sum(tirx.abs(wide(d(*r, k2))), axis=k2), name="row_l1")
        root = te.compute(rows, lambda *r: tirx.max(total[r], const(1)), name="row_l1_1")
    else:
        var = te.compute(
            rows, lambda *r: te.sum(let(wide(d(*r, k2)), lambda v: v * v, "d"), axis=k2), name="row_var"
        )
        root = isqrt_stages(te.compute(rows, lambda *r: tirx.max(var[r], const(1)), name="row_var1"))
        if eps is not None:
            sqrt = root
            root = te.compute(rows, lambda *r: tirx.max(sqrt[r], const(eps)), name="row_root_eps")
    recip = te.compute(
        rows, lambda *r: tirx.truncdiv(const(1 << 61), root[r]).astype("uint64"), name="row_recip"
    )

    def out(*i):
        u = (wide(d(*i)) * wide(recip[_row(i)])) >> const(61 - p)
        t = u * at(b, i, shape) + (at(bias, i, shape) if bias is not None else const(0))
        return saturate(round_shift(t, at(c, i, shape)) + wide(at(zy, i, shape)), qmin, qmax, str(zy.dtype))

    name = "ivit_l1layernorm" if l1 else "ivit_ilayernorm" if zx is None else "ivit_il2norm"
    return te.compute(shape, out, name=name)


def _threads(length: int, max_threads: int) -> int:
    """Threads per row: about four elements each, a warp at least."""
    t = 32
    while t < max_threads and t * 4 < length:
        t *= 2
    return t


def schedule(func: tirx.PrimFunc, target) -> tirx.PrimFunc:
    """One kernel for a row function of this module: cuda thread block per row, or llvm parallel rows."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    tail = blocks[-1] if _is_reduction(sch, blocks[-1]) else None  # :func:`output_row_sum`
    blocks = blocks[:-1] if tail is not None else blocks
    out = blocks[-1]
    rank = len(sch.get_loops(out))
    if rank == 1:
        sch.add_unit_loop(out)
    *row_loops, inner = sch.get_loops(out)
    row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    length = int(sch.get(inner).extent)
    cuda = target.kind.name == "cuda"
    threads = _threads(length, int(target.attrs.get("max_num_threads", 1024))) if cuda else 1

    def across_threads(loop):  # cuda: one split of the row for every stage, so each thread keeps its elements
        _, tx = sch.split(loop, factors=[None, threads])
        sch.bind(tx, "threadIdx.x")

    if cuda:
        sch.bind(row, "blockIdx.x")
        across_threads(inner)
    else:
        sch.parallel(row)
    for block in reversed(blocks[:-1]):
        loops = sch.get_loops(block)
        if len(loops) == rank and not _is_reduction(sch, block):  # full-size: recompute where read
            sch.compute_inline(block)
            continue
        sch.compute_at(block, row, preserve_unit_loops=True)
        if cuda and _is_reduction(sch, block):
            across_threads(sch.get_loops(block)[-1])
        sch.set_scope(block, 0, "local")
    if tail is not None:  # after the row's outputs, split as they are: each thread sums what it stored
        sch.reverse_compute_at(tail, row, preserve_unit_loops=True)
        if cuda:
            across_threads(sch.get_loops(tail)[-1])
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _is_reduction(sch, block) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)
