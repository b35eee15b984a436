"""Run attention's activation x activation GEMMs (Q·Kᵀ, P·V) on the native library's own exact kernel:
``MatMulInteger(A, B)`` with neither operand a constant becomes ``ai.ivit.engine`` QBatchMatMul
(``opset/native/qbatch_op.cpp``), with a following ``Requantize | RequantizeTable`` fused
(QBatchMatMulRequantize / QBatchMatMulTable) or chain_fold's ``RequantizeShiftmax`` (QBatchMatMulShiftmax:
the scores' Requantize in the GEMM's epilogue, as table indices in bytes, then the rows' Shiftmax; with the
table after it, ``RequantizeShiftmaxTable``: QBatchMatMulShiftmaxTable), and a Transpose of B's last two axes
absorbed (``trans_b``).

The op computes MatMulInteger's int32 accumulator bit for bit (then the Requantize and its table), so the
artifact keeps the bits of ``int.onnx``. Rewritten: zero points absent or constant single values;
Requantize parameters constant per tensor or along the last axis, shifts in 0..62; intermediates (the
accumulator, the transposed B) that nothing else reads (graph outputs and ``keep`` stay). Runs after
:mod:`.qgemm_fold`, which takes the GEMMs of constant weights.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .chain_fold import FUSED_DOMAIN
from .qgemm_fold import ENGINE_DOMAIN, HEADS, _Graph, apply, requantize_params

#: the fused op of each Requantize form after the GEMM
FUSED = {"QGemm": "QBatchMatMulRequantize", "QGemmTable": "QBatchMatMulTable"}
#: chain_fold's Requantize + Shiftmax, which the op takes where its table has at most this many entries
SHIFTMAX, SHIFTMAX_ENTRIES = (FUSED_DOMAIN, "RequantizeShiftmax"), 256
#: chain_fold's op of each Shiftmax form, and the engine's
SHIFTMAX_OPS = {
    "RequantizeShiftmax": "QBatchMatMulShiftmax",
    "RequantizeShiftmaxTable": "QBatchMatMulShiftmaxTable",
}


def _single(gr: _Graph, node: onnx.NodeProto, i: int) -> bool:
    """Input ``i`` is absent or a constant single value."""
    if i >= len(node.input) or not node.input[i]:
        return True
    v = gr.const(node, i)
    return v is not None and v.size == 1


def _transposed(gr: _Graph, tensor: str) -> str | None:
    """The input of a Transpose that swaps only the last two axes of ``tensor``, if nothing else reads it."""
    node = gr.producer.get(tensor)
    if node is None or node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    if perm is None or len(perm) < 2 or perm != [*range(len(perm) - 2), len(perm) - 1, len(perm) - 2]:
        return None
    return node.input[0] if gr.only_use(tensor) else None


def _head(gr: _Graph, gemm: onnx.NodeProto, g: onnx.GraphProto):
    """The Requantize (or RequantizeTable) that alone reads the accumulator and that the op can take, with
    its inputs as the op wants them, or None."""
    out = gemm.output[0]
    if not gr.only_use(out):
        return None
    head = gr.uses[out][0][0]
    if gr.uses[out][0][1] != 0:
        return None
    if head.domain == FUSED_DOMAIN and head.op_type in SHIFTMAX_OPS:
        return _shiftmax(gr, head, g)
    if (head.domain, head.op_type) not in HEADS:
        return None
    params = requantize_params(gr, head)
    if params is None or any(v.ndim > 1 for v in params[:3]):
        return None
    zx = params[0]
    if zx.dtype.kind not in "iu" or np.any(np.abs(zx.astype(np.int64)) >= 1 << 31):
        return None
    zx_name = head.input[1]
    if zx.dtype != np.int32:  # the op reads x_zero_point as int32
        zx_name = f"{head.name or head.output[0]}_qbatch_x_zero_point"
        g.initializer.append(numpy_helper.from_array(zx.astype(np.int32), zx_name))
    return head, [zx_name, *head.input[2:]]


def _shiftmax(gr: _Graph, head: onnx.NodeProto, g: onnx.GraphProto):
    """A RequantizeShiftmax the op takes (per-tensor parameters, a non-decreasing int32 table of at most 256
    entries: the index fits a byte and each row's exps come from one row of E), with its inputs as the op
    wants them, or None."""
    params = requantize_params(gr, head)
    table, zo = gr.const(head, 5), gr.const(head, 6)
    if params is None or table is None or zo is None or zo.size != 1 or any(v.size != 1 for v in params[:3]):
        return None
    if table.dtype != np.int32 or table.ndim != 1 or not 0 < table.size <= SHIFTMAX_ENTRIES:
        return None
    if np.any(np.diff(table.astype(np.int64)) < 0):
        return None
    zx = params[0]
    if zx.dtype.kind not in "iu" or abs(int(zx.reshape(-1)[0])) >= 1 << 31:
        return None
    zx_name = f"{head.name or head.output[0]}_qbatch_x_zero_point"
    g.initializer.append(numpy_helper.from_array(zx.astype(np.int32), zx_name))
    if head.op_type == "RequantizeShiftmaxTable" and gr.const(head, 7) is None:
        return None
    return head, [zx_name, *head.input[2:]]


def fold_attention(model: onnx.ModelProto, keep=frozenset()) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every MatMulInteger of two activations on the library's kernel; returns it
    and how many were rewritten."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    gr = _Graph(g, keep)
    replace: dict[int, onnx.NodeProto] = {}
    dead: set[int] = set()
    for i, gemm in enumerate(list(g.node)):
        if gemm.op_type != "MatMulInteger" or gemm.domain not in ("", "ai.onnx"):
            continue
        if gr.const(gemm, 0) is not None or gr.const(gemm, 1) is not None:
            continue
        if not (_single(gr, gemm, 2) and _single(gr, gemm, 3)):
            continue
        a, b = gemm.input[0], gemm.input[1]
        zps = [gemm.input[j] if j < len(gemm.input) else "" for j in (2, 3)]
        attrs = {}
        source = _transposed(gr, b)
        if source is not None:
            dead.add(id(gr.producer[b]))
            b, attrs["trans_b"] = source, 1
        found = _head(gr, gemm, g)
        tag = f"{gemm.name or gemm.output[0]}_qbatch_{i}"
        if found is None:
            node = helper.make_node(
                "QBatchMatMul", [a, b, *zps], [gemm.output[0]], name=tag, domain=ENGINE_DOMAIN, **attrs
            )
        else:
            head, params = found
            sm = head.domain == FUSED_DOMAIN and head.op_type in SHIFTMAX_OPS
            op = SHIFTMAX_OPS[head.op_type] if sm else FUSED[HEADS[(head.domain, head.op_type)]]
            names = ("qmin", "qmax", "x0", "n", "bits") if sm else ("qmin", "qmax")
            attrs |= {x.name: x.i for x in head.attribute if x.name in names}
            node = helper.make_node(
                op, [a, b, *zps, *params], [head.output[0]], name=tag, domain=ENGINE_DOMAIN, **attrs
            )
            dead.add(id(head))
        replace[id(gemm)] = node
    return out, apply(out, replace, dead)


__all__ = ["fold_attention"]
