"""Absorb attention's head split and merge into the library's QBatchMatMul ops: each operand that is only a
relayout of a ``[B, S, C]`` tensor X (a Reshape splitting C, then Transpose / Split / Slice / Squeeze /
Gather) is read from X in place as a head view, and a Transpose + Reshape that merges the heads of the output
is written in place; the copies onnxruntime made for them (about 6 % of DeiT's integer time) go.

A view reads ``A[b, h, s, d] = X[b, s, offset + h * dim + d]`` (``opset/native/qbatch_op.cpp``). The traced
layout must have exactly those strides, so the op reads the same values the copies held. The Reshape's
target needs constant sequence and channel entries (``[*, S, c1, ..., cn]``); the op checks at run time that
X is ``[B, S, c1 * ... * cn]``, which forces the batch entry too (a Reshape keeps the element count), so the
artifact computes the bits of ``int.onnx``. Runs after :mod:`.attn_fold`; relayout nodes left unread go.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from .qgemm_fold import ENGINE_DOMAIN, _Graph, apply, declared

#: the QBatchMatMul forms (attn_fold.py)
OPS = ("QBatchMatMul", "QBatchMatMulRequantize", "QBatchMatMulTable", "QBatchMatMulShiftmax",
       "QBatchMatMulShiftmaxTable")
STANDARD = ("", "ai.onnx")


class _Layout:
    """An operand as a strided view of X [B, S, C]: axes (size, stride in elements; size None: the batch) and
    a base offset, with the S and C the op checks at run time."""

    def __init__(self, source: str, axes: list, seq: int, channels: int, base: int = 0) -> None:
        self.source, self.axes, self.seq, self.channels, self.base = source, axes, seq, channels, base


def _ints(gr: _Graph, node: onnx.NodeProto, name: str, i: int) -> list[int] | None:
    """An int list given as attribute ``name`` or as constant input ``i`` (older and newer opsets)."""
    for a in node.attribute:
        if a.name == name:
            return list(a.ints)
    v = gr.const(node, i)
    return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


def _reshape_target(gr: _Graph, tensor: str) -> list[int | None] | None:
    """The entries of a Reshape's target shape: constants, or None where computed at run time."""
    c = gr.consts.get(tensor)
    if c is not None:
        return [int(x) for x in c.reshape(-1)]
    node = gr.producer.get(tensor)
    if node is None or node.op_type != "Concat" or node.domain not in STANDARD:
        return None
    out: list[int | None] = []
    for part in node.input:
        v = gr.consts.get(part)
        if v is None:
            out.append(None)  # a dynamic piece: one entry (the batch, from Shape)
        else:
            out.extend(int(x) for x in v.reshape(-1))
    return out


def _resolve(target: list, dims: list | None, allowzero: bool) -> list | None:
    """The Reshape target's entries after the first as numbers: a 0 copies the source's static dimension, a
    -1 takes the rest of its static row (only where the first entry copies the batch); None where unknown."""
    if target[0] is not None and target[0] < -1:
        return None
    out = list(target)
    for i in range(1, len(out)):
        if out[i] == 0 and not allowzero:
            out[i] = dims[i] if dims is not None and i < len(dims) else None
    if -1 in out[1:]:
        rows = dims[1:] if dims is not None else [None]
        if target[0] != 0 or allowzero or out[1:].count(-1) != 1 or None in rows or None in out[1:]:
            return None
        known = math.prod(v for v in out[1:] if v != -1)
        if known < 1 or math.prod(rows) % known:
            return None
        out[out.index(-1, 1)] = math.prod(rows) // known
    return out if all(v is not None and v >= 1 for v in out[1:]) else None


def _trace(gr: _Graph, tensor: str, shapes: dict) -> _Layout | None:
    """The layout of ``tensor`` as a view of a [B, S, C] tensor, through the relayout ops, or None
    (``shapes``: the static shapes the model declares, for a Reshape's 0 and -1 entries)."""
    node = gr.producer.get(tensor)
    if node is None or node.domain not in STANDARD:
        return None
    op = node.op_type
    if op == "Reshape":
        target = _reshape_target(gr, node.input[1])
        allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
        target = None if target is None or len(target) < 3 else _resolve(target, shapes.get(node.input[0]),
                                                                         allowzero)
        if target is None:
            return None
        seq, split = target[1], target[2:]
        channels = math.prod(split)
        strides = [math.prod(split[i + 1:]) for i in range(len(split))]
        axes = [(None, seq * channels), (seq, channels), *zip(split, strides, strict=True)]
        return _Layout(node.input[0], axes, seq, channels)
    up = _trace(gr, node.input[0], shapes)
    if up is None:
        return None
    axes = up.axes
    if op == "Transpose":
        perm = _ints(gr, node, "perm", 99)
        if perm is None or sorted(perm) != list(range(len(axes))):
            return None
        return _Layout(up.source, [axes[p] for p in perm], up.seq, up.channels, up.base)
    if op == "Squeeze":
        drop = _ints(gr, node, "axes", 1)
        if drop is None:
            return None
        drop = {d % len(axes) for d in drop}
        if any(axes[d][0] != 1 for d in drop):
            return None
        kept = [a for i, a in enumerate(axes) if i not in drop]
        return _Layout(up.source, kept, up.seq, up.channels, up.base)
    if op == "Gather":
        index = gr.const(node, 1)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(axes)
        size, stride = axes[axis]
        if index is None or index.ndim != 0 or size is None:
            return None
        i = int(index) % size
        return _Layout(up.source, axes[:axis] + axes[axis + 1:], up.seq, up.channels, up.base + i * stride)
    if op == "Slice":  # constant starts, ends, axes; steps 1
        starts, ends = _ints(gr, node, "starts", 1), _ints(gr, node, "ends", 2)
        picked = _ints(gr, node, "axes", 3) or list(range(len(starts or [])))
        steps = _ints(gr, node, "steps", 4) if len(node.input) > 4 and node.input[4] else None
        if starts is None or ends is None or (steps and set(steps) != {1}) or len(picked) != len(starts):
            return None
        part, base = list(axes), up.base
        for axis, lo, hi in zip(picked, starts, ends, strict=True):
            axis %= len(axes)
            size, stride = part[axis]
            if size is None:
                return None
            lo, hi = (v + size if v < 0 else v for v in (lo, hi))
            lo, hi = min(max(lo, 0), size), min(max(hi, 0), size)
            part[axis] = (max(hi - lo, 0), stride)
            base += lo * stride
        return _Layout(up.source, part, up.seq, up.channels, base)
    if op == "Split":
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0) % len(axes)
        size, stride = axes[axis]
        sizes = _ints(gr, node, "split", 1)
        if size is None:
            return None
        if sizes is None:
            if size % len(node.output):
                return None
            sizes = [size // len(node.output)] * len(node.output)
        j = list(node.output).index(tensor)
        start = sum(sizes[:j])
        part = list(axes)
        part[axis] = (sizes[j], stride)
        return _Layout(up.source, part, up.seq, up.channels, up.base + start * stride)
    return None


def _view(lay: _Layout | None) -> tuple[dict, bool] | None:
    """The op's head view of a traced operand (heads, dim, offset; seq, channels) and whether its last two
    axes are swapped (a Kᵀ given as [B, H, D, S]), or None where the strides are not a head view's."""
    if lay is None or len(lay.axes) != 4:
        return None
    (b, sb), (h, sh), r1, r2 = lay.axes
    if b is not None or sb != lay.seq * lay.channels or h is None:
        return None
    for swapped, ((s, ss), (d, sd)) in ((False, (r1, r2)), (True, (r2, r1))):
        if s == lay.seq and ss == lay.channels and sd == 1 and sh == d and lay.base + h * d <= lay.channels:
            view = {"heads": h, "dim": d, "offset": lay.base, "seq": lay.seq, "channels": lay.channels}
            return view, swapped
    return None


def _merge(gr: _Graph, node: onnx.NodeProto, heads: int, cols: int):
    """The Transpose [0, 2, 1, 3] + Reshape to [*, rows, heads * cols] that alone read the op's output, and
    the rows the Reshape names (0: copied, as the op's rows are), or None."""
    out = node.output[0]
    if not gr.only_use(out):
        return None
    tr = gr.uses[out][0][0]
    if tr.op_type != "Transpose" or tr.domain not in STANDARD or _ints(gr, tr, "perm", 99) != [0, 2, 1, 3]:
        return None
    if not gr.only_use(tr.output[0]):
        return None
    rs = gr.uses[tr.output[0]][0][0]
    if rs.op_type != "Reshape" or rs.domain not in STANDARD or rs.input[0] != tr.output[0]:
        return None
    target = _reshape_target(gr, rs.input[1])
    allowzero = any(a.name == "allowzero" and a.i for a in rs.attribute)
    if target is None or len(target) != 3 or target[1] is None or target[1] < 0:
        return None
    if allowzero and 0 in target:
        return None
    # the columns: heads * cols, or the rest where the batch is copied (0) and the rows are given or copied
    if target[2] != heads * cols and not (target[2] == -1 and target[0] == 0):
        return None
    return tr, rs, target[1]


def static_shapes(model: onnx.ModelProto) -> dict[str, list]:
    """The shapes the model declares (:func:`.qgemm_fold.declared`), by tensor: dimensions, None where
    dynamic."""
    return {name: [d if isinstance(d, int) else None for d in dims]
            for name, (_, dims) in declared(model.graph).items() if dims is not None}


def head_views(
    model: onnx.ModelProto, keep=frozenset(), shapes: dict | None = None
) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with attention's head split and merge read and written in place by its
    QBatchMatMul ops; returns it and how many operands and outputs were absorbed. ``shapes``: static shapes
    by tensor (:func:`static_shapes` of the model as converted: the compile step's re-encodings drop the
    declarations of what they retype), else the model's own."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    gr = _Graph(g, keep)
    shapes = static_shapes(out) if shapes is None else shapes
    replace: dict[int, onnx.NodeProto] = {}
    dead: set[int] = set()
    done = 0
    for node in g.node:
        if node.domain != ENGINE_DOMAIN or node.op_type not in OPS:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        if any(k.endswith("_heads") for k in attrs):
            continue
        inputs = list(node.input)
        trans_b = attrs.get("trans_b", 0)
        views = {}
        for side, i in (("a", 0), ("b", 1)):
            layout = _trace(gr, inputs[i], shapes)
            found = _view(layout)
            if found is None or (side == "a" and found[1]):
                continue
            view, swapped = found
            views[side] = view
            inputs[i] = layout.source
            if swapped:
                trans_b = 1 - trans_b
        if "a" in views and "b" in views and views["a"]["heads"] != views["b"]["heads"]:
            continue  # (broadcast heads: left as they are)
        if not views:
            continue
        new = dict(attrs)
        new["trans_b"] = trans_b
        for side, v in views.items():
            new |= {f"{side}_{k}": v[k] for k in ("heads", "dim", "offset", "seq", "channels")}
            done += 1
        output = node.output[0]
        if "b" in views:  # the heads and the columns are the view's; the rows the op checks at run time
            b = views["b"]
            merge = _merge(gr, node, b["heads"], b["seq"] if trans_b else b["dim"])
            if merge is not None:
                new |= {"y_heads": b["heads"], "y_seq": merge[2]}
                output = merge[1].output[0]
                dead |= {id(merge[0]), id(merge[1])}
                done += 1
        attrs = {k: v for k, v in new.items() if v or k in ("qmin", "qmax")}
        replace[id(node)] = helper.make_node(node.op_type, inputs, [output], name=node.name,
                                             domain=ENGINE_DOMAIN, **attrs)
    if not replace:
        return out, 0
    apply(out, replace, dead)
    _drop_unread(out.graph, gr.protected)
    return out, done


def _drop_unread(g: onnx.GraphProto, protected: set[str]) -> None:
    """Remove the nodes whose outputs nothing reads (the relayout chains the views replaced), repeatedly."""
    while True:
        read = {i for n in g.node for i in n.input} | protected
        keep = [n for n in g.node if any(o in read for o in n.output if o)]
        if len(keep) == len(g.node):
            return
        del g.node[:]
        g.node.extend(keep)


__all__ = ["head_views"]
