"""Fold a GEMM's int32 bias ``Add`` into the ``Requantize`` after it, for the native custom-op library.

The converter writes ``Requantize(Add(MatMulInteger(a, w), bias), zx, b, c, zy)``: one more pass over every
int32 accumulator. Since ``(acc + bias) - zx == acc - (zx - bias)``, the Add goes and the Requantize takes
the per-channel zero point ``zx - bias`` (the library's fused loop takes zero points per channel, at no
extra cost). Exact where ``acc + bias`` cannot wrap in int32 (the Add it replaces is int32), so a pair is
folded only when, for every output column, ``255 * sum_k |w - zw| + |bias|`` (activations differ from
their zero point by at most 255) and ``|zx - bias|`` stay below ``2**31``, from the constant weights.
Applied at session time, like :mod:`.u8_gemm`, to the model the library runs; the converted model
keeps its Add.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ivit_onnx.graph import input_uses
from ivit_onnx.opset import DOMAIN

I31 = 1 << 31


def _int_const(inits: dict, name: str) -> np.ndarray | None:
    t = inits.get(name)
    if t is None:
        return None
    v = numpy_helper.to_array(t)
    return v.astype(np.int64) if v.dtype.kind in "iu" else None


def _column_bound(inits: dict, gemm: onnx.NodeProto) -> np.ndarray | None:
    """``255 * sum_k |w - zw|`` per output column of a MatMulInteger with constant 2-D weights."""
    if gemm.op_type != "MatMulInteger" or len(gemm.input) < 2:
        return None
    w = _int_const(inits, gemm.input[1])
    zw = _int_const(inits, gemm.input[3]) if len(gemm.input) > 3 and gemm.input[3] else np.int64(0)
    za = _int_const(inits, gemm.input[2]) if len(gemm.input) > 2 and gemm.input[2] else np.int64(0)
    if w is None or w.ndim != 2 or zw is None or za is None or za.size != 1:
        return None
    if not -128 <= int(za.reshape(-1)[0]) <= 255:
        return None
    return 255 * np.abs(w - zw).sum(axis=0)


def fold_bias(model: onnx.ModelProto, keep=frozenset()) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every provably exact bias Add folded; returns it and how many were folded.

    Tensors named in ``keep`` (intermediates a caller wants to read) are never folded away.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers = input_uses(g)
    outputs = {o.name for o in g.output} | set(keep)
    dead, folded = [], 0
    for add in g.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or add.output[0] in outputs:
            continue
        uses = consumers.get(add.output[0], [])
        if len(uses) != 1 or uses[0][1] != 0:
            continue
        req = uses[0][0]
        if req.domain != DOMAIN or req.op_type != "Requantize":
            continue
        acc, bias_name = add.input
        if acc in inits:
            acc, bias_name = bias_name, acc
        bias, zx = _int_const(inits, bias_name), _int_const(inits, req.input[1])
        gemm = producer.get(acc)
        bound = _column_bound(inits, gemm) if gemm is not None else None
        if bias is None or zx is None or zx.size != 1 or bound is None or bias.shape != bound.shape:
            continue
        new_zx = int(zx.reshape(-1)[0]) - bias
        if np.any(bound + np.abs(bias) >= I31) or np.any(np.abs(new_zx) >= I31):
            continue
        name = f"{req.name or req.output[0]}_bias_folded_zero_point"
        g.initializer.append(numpy_helper.from_array(new_zx.astype(np.int32), name))
        req.input[0], req.input[1] = acc, name
        dead.append(add)
        folded += 1
    for n in dead:
        g.node.remove(n)
    return out, folded


__all__ = ["fold_bias"]
