"""Fuse the IAdd that alone reads a QGemm's output into the GEMM's epilogue: ``QGemm | QGemmTable -> IAdd``
becomes ``ai.ivit.engine`` QGemmAdd / QGemmTableAdd (``opset/native/qgemm.cpp``'s residual stage), so the
GEMM's output goes to memory once, as the sum: the residual adds after DeiT's attention projections and fc2,
and the bias IAdd(constant) after each Requantize of onnxruntime ``quantize_static`` models.

The stage computes the IAdd's int64 arithmetic bit for bit, with the GEMM's output v on the side of the IAdd
it has in the graph, so the artifact keeps the bits of ``int.onnx``. Fused: an IAdd of the private domain
whose zero points, multipliers and shift (0..62) are constant single values, v's zero point of v's type; the
other addend r a constant along the last axis (1 or N values), or an int8/uint8/int16/int32 activation of the
zero point's type whose known shape, leading 1s dropped, ends v's (so the sum has v's shape); the GEMM's
output read by nothing else (graph outputs and ``keep`` stay). Runs after :mod:`.qgemm_fold`.

A second IAdd that alone reads that sum goes into the same epilogue where one of the two addends at most is
an activation (QGemmAddAdd / QGemmTableAddAdd): ``quantize_static``'s residual IAdd after the bias IAdd. A
RequantizeTable (:mod:`.chain_fold`'s) that alone reads the last sum goes in too, as a table over the sum's
values (at most 65536; the op names end in ``Table``): in ``quantize_static`` models the GELU after fc1's
bias IAdd, which chain_fold tabulates over its 8-bit input.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.opset import DOMAIN, OPS

from .chain_fold import FUSED_DOMAIN
from .qgemm_fold import ENGINE_DOMAIN, _Graph, apply, declared

#: the fused op of each GEMM form, and of each fused one with a table after the sum
FUSED = {"QGemm": "QGemmAdd", "QGemmTable": "QGemmTableAdd"}
SECOND = {"QGemmAdd": "QGemmAddAdd", "QGemmTableAdd": "QGemmTableAddAdd"}
POST = {op: f"{op}Table" for op in ("QGemmAdd", "QGemmTableAdd", "QGemmAddAdd", "QGemmTableAddAdd")}
#: most entries of the table after the sum (the library's bound)
MAX_POST = 1 << 16
#: the residual types the stage reads
TYPES = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.int32)}


def _ends(r: list | None, v: list | None) -> bool:
    """``r``'s dims, leading 1s dropped, are known and equal the last of ``v``'s, and r has no more axes."""
    if r is None or v is None or len(r) > len(v):
        return False
    lead = next((i for i, d in enumerate(r) if d != 1), len(r))
    tail = r[lead:]
    return all(d is not None and d == w for d, w in zip(tail, v[len(v) - len(tail):], strict=True))


def _stage(gr: _Graph, node: onnx.NodeProto, v_type: np.ndarray | None, n: int, info: dict):
    """``(IAdd, its 7 inputs as the op takes them, its qmin and qmax)`` for the IAdd that alone reads
    ``node``'s output (v, of ``v_type``'s type, N = ``n`` columns), or None where the pattern or a parameter
    fails."""
    out = node.output[0]
    if not gr.only_use(out):
        return None
    iadd, side = gr.uses[out][0]
    if iadd.domain != DOMAIN or iadd.op_type != "IAdd" or side not in (0, 1) or len(iadd.input) != 8:
        return None
    params = [gr.const(iadd, i) for i in range(2, 8)]
    if any(p is None or p.size != 1 for p in params):
        return None
    za, zb, ma, mb, shift, zy = params
    if ma.dtype != np.int64 or mb.dtype != np.int64 or shift.dtype != np.int64:
        return None
    if not 0 <= int(shift.reshape(-1)[0]) <= 62:
        return None
    zv, zr = (za, zb) if side == 0 else (zb, za)
    if v_type is None or zv.dtype != v_type.dtype or zr.dtype not in TYPES:
        return None
    v_dims = info.get(out, (0, None))[1]
    r_name = iadd.input[1 - side]
    r = gr.consts.get(r_name)
    if r is not None:  # along the last axis, adding no axes to v
        if r.dtype not in TYPES or not (r.size == 1 or (r.size == n and r.shape[-1] == n)):
            return None
        if r.ndim > 1 and not (v_dims is not None and r.ndim <= len(v_dims)):
            return None
    else:
        elem, r_dims = info.get(r_name, (0, None))
        if elem != helper.np_dtype_to_tensor_dtype(zr.dtype) or not r_dims or r_dims[-1] != n:
            return None
        if not _ends(r_dims, v_dims):
            return None
    names = iadd.input[2:]
    v_zp, r_zp, v_m, r_m = (names[0], names[1], names[2], names[3]) if side == 0 else (
        names[1], names[0], names[3], names[2])
    bounds = {a.name: a.i for a in iadd.attribute if a.name in ("qmin", "qmax")}
    if len(bounds) != 2:
        return None
    return iadd, [r_name, v_zp, r_zp, v_m, r_m, names[4], names[5]], bounds


def _fused(gr: _Graph, gemm: onnx.NodeProto, info: dict):
    """``(the fused node, the IAdd it replaces)`` after ``gemm``, or None where the pattern or a parameter
    fails."""
    w = gr.const(gemm, 2)
    if w is None:
        return None
    found = _stage(gr, gemm, gr.const(gemm, 8 if gemm.op_type == "QGemmTable" else 7), w.shape[1], info)
    attrs = {a.name: a.i for a in gemm.attribute if a.name in ("qmin", "qmax")}
    if found is None or len(attrs) != 2:
        return None
    iadd, inputs, bounds = found
    attrs |= {f"add_{k}": v for k, v in bounds.items()}
    node = helper.make_node(FUSED[gemm.op_type], [*gemm.input, *inputs], [iadd.output[0]],
                            name=f"{gemm.name}_add", domain=ENGINE_DOMAIN, **attrs)
    return node, iadd


def _second(gr: _Graph, fused: onnx.NodeProto, info: dict):
    """``(the fused node with a second IAdd stage, that IAdd)`` where an IAdd alone reads the first one's sum
    and one of the two residuals at most is an activation (``quantize_static``'s bias, then the residual),
    else None."""
    first_r = fused.input[9 if fused.op_type == "QGemmTableAdd" else 8]
    found = _stage(gr, fused, gr.consts.get(fused.input[-1]), gr.const(fused, 2).shape[1], info)
    if found is None or (first_r not in gr.consts and found[1][0] not in gr.consts):
        return None
    iadd, inputs, bounds = found
    attrs = {a.name: a.i for a in fused.attribute} | {f"add2_{k}": v for k, v in bounds.items()}
    return helper.make_node(SECOND[fused.op_type], [*fused.input, *inputs], [iadd.output[0]], name=fused.name,
                            domain=ENGINE_DOMAIN, **attrs), iadd


def _post(gr: _Graph, fused: onnx.NodeProto, g: onnx.GraphProto):
    """``(fused node with the table after its sum, the RequantizeTable it absorbs)`` where one alone reads
    the sum with constant per-tensor parameters, else None. The table: that RequantizeTable's reference
    output for every sum in add_qmin..add_qmax."""
    out = fused.output[0]
    if not gr.only_use(out):
        return None
    table, at = gr.uses[out][0]
    if table.domain != FUSED_DOMAIN or table.op_type != "RequantizeTable" or at != 0 or len(table.input) != 6:
        return None
    params = [gr.const(table, i) for i in range(1, 6)]
    zy_sum = gr.consts.get(fused.input[-1])
    if any(p is None for p in params) or any(p.size != 1 for p in params[:4]) or zy_sum is None:
        return None
    attrs = {a.name: a.i for a in fused.attribute}
    last = "add2_" if "add2_qmin" in attrs else "add_"  # the last stage's bounds
    lo, hi = attrs[f"{last}qmin"], attrs[f"{last}qmax"]
    if not 0 < hi - lo + 1 <= MAX_POST:
        return None
    zx, b, c, zy, entries = params
    t = {a.name: a.i for a in table.attribute}
    if entries.ndim != 1 or entries.size != t["qmax"] - t["qmin"] + 1:
        return None
    sums = np.arange(lo, hi + 1).astype(zy_sum.dtype)
    index = OPS["Requantize"].run(sums, zx, b, c, zy, qmin=t["qmin"], qmax=t["qmax"]).astype(np.int64)
    name = f"{fused.name}_post_table"
    g.initializer.append(numpy_helper.from_array(entries[index - t["qmin"]], name))
    node = helper.make_node(POST[fused.op_type], [*fused.input, name], [table.output[0]], name=fused.name,
                            domain=ENGINE_DOMAIN, **attrs)
    return node, table


def fold_residuals(model: onnx.ModelProto, keep=frozenset()) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with the IAdd after each QGemm (QGemmTable) in its epilogue where it can be;
    returns it and how many were fused."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    gr = _Graph(g, keep)
    info = declared(g)
    replace: dict[int, onnx.NodeProto] = {}
    dead: set[int] = set()
    taken = lambda node: id(node) in replace or id(node) in dead  # noqa: E731
    for gemm in list(g.node):
        if gemm.domain != ENGINE_DOMAIN or gemm.op_type not in FUSED:
            continue
        found = _fused(gr, gemm, info)
        if found is None or taken(found[1]):  # an IAdd of two QGemms: the first
            continue
        fused, at = found  # the fused node takes the place of the last node it absorbs
        second = _second(gr, fused, info)
        if second is not None and not taken(second[1]):
            dead.add(id(at))
            fused, at = second
        post = _post(gr, fused, g)
        if post is not None:
            fused = post[0]
            dead.add(id(post[1]))
        replace[id(at)] = fused
        dead.add(id(gemm))
    return out, apply(out, replace, dead)


__all__ = ["POST", "SECOND", "fold_residuals"]
