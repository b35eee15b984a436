"""Fuse ``MatMulInteger (constant int8 weights) -> [bias Add] -> Requantize | RequantizeTable`` into the
native library's own GEMM, ``ai.ivit.engine`` QGemm / QGemmTable (``opset/native/qgemm.cpp``).

onnxruntime's MatMulInteger writes every int32 accumulator to memory and the Requantize after it reads it
back; QGemm rescales each tile while it is in L1, with weights packed once per session, on the best exact path
of the CPU (AVX-512 VNNI, AVX2, aarch64 smmla, sdot or NEON, portable). It computes exactly MatMulInteger's
int32 accumulator, then the Requantize (and its table), so the artifact keeps the bits of ``int.onnx``. A bias
Add goes into the per-column zero point (``(acc + bias) - zx == acc - (zx - bias)``), only where ``acc +
bias`` provably cannot wrap in int32 (the bound of :mod:`.bias_fold`). Fused: constant int8 2-D weights with a
per-tensor or per-column int8 zero point, a constant scalar activation zero point, Requantize parameters that
are constants per tensor or along the last axis (rank 0 or 1), shifts in 0..62, and intermediates that nothing
else reads (graph outputs and ``keep`` stay). Runs after :mod:`.chain_fold`, so a tabulated chain ends in the
same GEMM.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.graph import input_uses
from ivit_onnx.opset import DOMAIN, native_kernels

from .bias_fold import I31, _column_bound
from .chain_fold import FUSED_DOMAIN

ENGINE_DOMAIN = "ai.ivit.engine"
#: the Requantize forms a QGemm absorbs: (domain, op_type) -> the fused op
HEADS = {(DOMAIN, "Requantize"): "QGemm", (FUSED_DOMAIN, "RequantizeTable"): "QGemmTable"}


class _Graph:
    def __init__(self, g: onnx.GraphProto, keep) -> None:
        self.protos = {t.name: t for t in g.initializer}
        self.consts = {name: numpy_helper.to_array(t) for name, t in self.protos.items()}
        self.producer = {o: n for n in g.node for o in n.output}
        self.uses = input_uses(g)
        self.protected = {o.name for o in g.output} | set(keep)

    def const(self, node: onnx.NodeProto, i: int) -> np.ndarray | None:
        return self.consts.get(node.input[i]) if i < len(node.input) and node.input[i] else None

    def only_use(self, tensor: str) -> bool:
        return tensor not in self.protected and len(self.uses.get(tensor, [])) == 1

    def gemm_of(self, tensor: str):
        """``(MatMulInteger, bias or None)`` computing ``tensor``, or None."""
        node = self.producer.get(tensor)
        bias = None
        add = node is not None and node.op_type == "Add" and node.domain in ("", "ai.onnx")
        if add and self.only_use(tensor):
            for side in (0, 1):
                b = self.consts.get(node.input[side])
                if b is not None and b.dtype.kind in "iu":
                    bias, tensor = b.astype(np.int64), node.input[1 - side]
                    break
            node = self.producer.get(tensor) if bias is not None else None
        if node is None or node.op_type != "MatMulInteger" or node.domain not in ("", "ai.onnx"):
            return None
        return (node, bias) if self.only_use(tensor) else None


def _per_column(v: np.ndarray | None, n: int) -> bool:
    return v is not None and v.ndim <= 1 and v.size in (1, n)


def declared(g: onnx.GraphProto) -> dict[str, tuple[int, list | None]]:
    """Each tensor's (element type, dims: int or symbol, None where unknown) that the graph records."""
    out = {}
    for v in (*g.value_info, *g.input, *g.output):
        t = v.type.tensor_type
        dims = None
        if t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        out[v.name] = (t.elem_type, dims)
    return out


def requantize_params(gr: _Graph, head: onnx.NodeProto):
    """A Requantize's constant (zx, multiplier, shift, zy) in the forms the engine's ops take (int64
    multipliers and shifts, shifts in 0..62, one zy), or None."""
    zx, mult, shift, zy = (gr.const(head, i) for i in (1, 2, 3, 4))
    if zx is None or mult is None or shift is None or zy is None or zy.size != 1:
        return None
    if mult.dtype != np.int64 or shift.dtype != np.int64 or np.any(shift < 0) or np.any(shift > 62):
        return None
    return zx, mult, shift, zy


def _fused(gr: _Graph, head: onnx.NodeProto, g: onnx.GraphProto, fresh) -> onnx.NodeProto | None:
    """The QGemm node replacing ``head`` and what feeds it, or None where the pattern or a bound fails."""
    found = gr.gemm_of(head.input[0])
    if found is None:
        return None
    gemm, bias = found
    w, za = gr.const(gemm, 1), gr.const(gemm, 2)
    zw = gr.const(gemm, 3) if len(gemm.input) > 3 and gemm.input[3] else np.zeros((), np.int8)
    if w is None or w.dtype != np.int8 or w.ndim != 2 or za is None or za.size != 1 or zw is None:
        return None
    n = w.shape[1]
    if zw.dtype != np.int8 or not _per_column(zw, n):
        return None
    params = requantize_params(gr, head)
    if params is None or not all(_per_column(v, n) for v in params[:3]):
        return None
    zx, mult, shift, zy = params
    zx = zx.astype(np.int64).reshape(-1)
    if bias is not None:
        bound = _column_bound(gr.protos, gemm)
        if not _per_column(bias, n) or bound is None:
            return None
        zx = zx - bias.reshape(-1)
        if np.any(bound + np.abs(bias.reshape(-1)) >= I31) or np.any(np.abs(zx) >= I31):
            return None
    tag = f"{head.name or head.output[0]}_qgemm"
    zx_name = f"{tag}_x_zero_point"
    g.initializer.append(numpy_helper.from_array(zx.astype(np.int32), zx_name))
    zw_name = gemm.input[3] if len(gemm.input) > 3 and gemm.input[3] else f"{tag}_b_zero_point"
    if zw_name not in gr.consts:
        g.initializer.append(numpy_helper.from_array(zw, zw_name))
    op = HEADS[(head.domain, head.op_type)]
    inputs = [gemm.input[0], gemm.input[2], gemm.input[1], zw_name, zx_name, *head.input[2:]]
    attrs = {a.name: a.i for a in head.attribute if a.name in ("qmin", "qmax")}
    return helper.make_node(op, inputs, [head.output[0]], name=f"{tag}_{next(fresh)}", domain=ENGINE_DOMAIN,
                            **attrs)


#: QGemm's instruction-set paths by IVIT_GEMM_ISA name, with qgemm.h's codes
GEMM_PATHS = {"portable": 1, "avx2": 2, "vnni": 3, "neon": 4, "dotprod": 5, "i8mm": 6, "amx": 7}
#: the vector ones: all but the portable loop
VECTOR_PATHS = tuple(code for name, code in GEMM_PATHS.items() if name != "portable")


def fast_path() -> bool:
    """Whether the native library has a vector QGemm path on this CPU that its self-check accepted (AVX2,
    AVX-512 VNNI, aarch64 NEON, sdot or smmla): elsewhere (old x86, other architectures) its portable loop
    is far slower than onnxruntime's MatMulInteger, which compile then keeps."""
    lib = native_kernels._LIB
    return lib is not None and hasattr(lib, "ivit_qgemm_usable") and any(
        lib.ivit_qgemm_usable(isa) for isa in VECTOR_PATHS)


def fold_qgemm(model: onnx.ModelProto, keep=frozenset()) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every eligible GEMM -> Requantize pair fused; returns it and how many were."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    gr = _Graph(g, keep)
    fresh = iter(range(1 << 30))
    replace: dict[int, onnx.NodeProto] = {}
    dead: set[int] = set()
    for head in list(g.node):
        if (head.domain, head.op_type) not in HEADS:
            continue
        fused = _fused(gr, head, g, fresh)
        if fused is None:
            continue
        replace[id(head)] = fused
        node = gr.producer[head.input[0]]
        dead.add(id(node))
        if node.op_type == "Add":
            dead.add(id(gr.producer[next(i for i in node.input if i in gr.producer)]))
    return out, apply(out, replace, dead)


def apply(model: onnx.ModelProto, replace: dict[int, onnx.NodeProto], dead: set[int]) -> int:
    """Put each fused node in place of the node it replaces (by id), drop the ``dead`` ones it absorbed, and
    declare the engine's domain; returns how many were fused."""
    if not replace:
        return 0
    g = model.graph
    nodes = [replace.get(id(n), n) for n in g.node if id(n) not in dead]
    del g.node[:]
    g.node.extend(nodes)
    if not any(o.domain == ENGINE_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(ENGINE_DOMAIN, 1))
    return len(replace)


__all__ = ["ENGINE_DOMAIN", "apply", "declared", "fast_path", "fold_qgemm", "requantize_params"]
