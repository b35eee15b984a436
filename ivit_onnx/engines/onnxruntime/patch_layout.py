"""Run a patch embedding's per-channel ops on its GEMM's [N, H*W, C] output, without transposes around them.

:mod:`.patch_gemm` computes a patch-embedding ConvInteger as ``MatMulInteger -> Transpose(0, 2, 1) ->
Reshape(N, C, H, W)``; the model then adds the bias and requantizes per channel on NCHW, and flattens it back
to tokens (``Reshape(N, C, H*W) -> Transpose(0, 2, 1)``, torch's ``flatten(2).transpose(1, 2)``). Per-channel
and per-tensor elementwise ops commute with that layout change, so they run on the GEMM's output directly,
their [C, 1, 1] parameters as [C] vectors: two int32 transposes of the whole activation go, and the bias fold
and QGemm fusion after this pass take the GEMM. A Shape read of the NCHW tensors (or of the flattened one)
gets [N, C, H, W] (or [N, C, H*W]) rebuilt from the batch of the GEMM's A. Applied at compile time for the
onnxruntime engine: bit for bit the same values.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.opset import DOMAIN

from .qgemm_fold import _Graph

# elementwise ops whose non-data inputs may be per-channel constants: (domain, op) -> data input index
_PER_CHANNEL = {("", "Add"): None, (DOMAIN, "Requantize"): 0}
_SHAPE_OPS = {"Shape", "Slice", "Concat", "Identity", "Gather", "Unsqueeze", "Squeeze", "Cast"}


def _whole_shape(node: onnx.NodeProto) -> bool:
    """A Shape of every dimension (no end, start 0 if given)."""
    return node.op_type == "Shape" and all(a.name == "start" and a.i == 0 for a in node.attribute)


def _perm(node: onnx.NodeProto) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), [])


def _users(gr: _Graph, tensor: str) -> list[onnx.NodeProto]:
    return [n for n, _ in gr.uses.get(tensor, [])]


def _only(gr: _Graph, tensor: str) -> onnx.NodeProto | None:
    """The only consumer of ``tensor``, if nothing protects it."""
    return gr.uses[tensor][0][0] if gr.only_use(tensor) else None


def _channel_vector(v: np.ndarray, c: int) -> np.ndarray | None:
    """A per-tensor (one value) or per-channel ([..., C, 1, 1] with leading 1s, rank <= 4) constant as it
    broadcasts over [N, L, C]: unchanged, or as a [C] vector; None where it broadcasts otherwise."""
    if v.size == 1:
        return v
    if v.ndim < 3 or v.ndim > 4 or v.shape[-3:] != (c, 1, 1) or any(d != 1 for d in v.shape[:-3]):
        return None
    return v.reshape(c)


def _flatten_target(gr: _Graph, reshape: onnx.NodeProto, chain: set[str], c: int, hw: int) -> bool:
    """Whether ``reshape`` takes [N, C, H, W] to [N, C, H*W]: a constant target [0 | -1 | N, C, H*W | -1], or
    torch's ``Concat(Slice(Shape(t), 0, 2), [-1])`` of a chain tensor t."""
    target = gr.consts.get(reshape.input[1])
    if target is not None:
        t = target.tolist()
        return len(t) == 3 and t[1] == c and t[2] in (hw, -1) and (t[0] in (0, -1) or t[2] == hw)
    concat = gr.producer.get(reshape.input[1])
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return False
    tail = gr.consts.get(concat.input[1])
    sl = gr.producer.get(concat.input[0])
    if tail is None or tail.tolist() != [-1] or sl is None or sl.op_type != "Slice" or len(sl.input) < 3:
        return False
    starts, ends = gr.consts.get(sl.input[1]), gr.consts.get(sl.input[2])
    axes = gr.consts.get(sl.input[3]) if len(sl.input) > 3 and sl.input[3] else np.array([0])
    steps = gr.consts.get(sl.input[4]) if len(sl.input) > 4 and sl.input[4] else np.array([1])
    shape = gr.producer.get(sl.input[0])
    return (starts is not None and ends is not None and axes is not None and steps is not None
            and starts.tolist() == [0] and ends.tolist() == [2] and axes.tolist() in ([0], [-1])
            and steps.tolist() == [1] and shape is not None and _whole_shape(shape)
            and shape.input[0] in chain)


def _match(gr: _Graph, first: onnx.NodeProto):
    """The pattern from a Transpose(0, 2, 1) of a patch GEMM's output: (its [C] size, [C, H, W], the chain
    of per-channel nodes, the Shape nodes reading the chain, the nodes that go), or None."""
    gemm = gr.producer.get(first.input[0])
    if gemm is None or gemm.op_type != "MatMulInteger" or _perm(first) != [0, 2, 1]:
        return None
    w = gr.consts.get(gemm.input[1])
    if w is None or w.ndim != 2:
        return None
    c = int(w.shape[1])
    rows = gr.producer.get(gemm.input[0])  # patch_gemm's [N, L, K] patches: L tokens
    tokens = gr.consts.get(rows.input[1]) if rows is not None and rows.op_type == "Reshape" else None
    r1 = _only(gr, first.output[0])
    target = gr.consts.get(r1.input[1]) if r1 is not None and r1.op_type == "Reshape" else None
    if tokens is None or tokens.ndim != 1 or len(tokens) != 3 or target is None or target.ndim != 1:
        return None
    if len(target) != 4 or target[0] not in (0, -1) or target[1] != c or min(target[2:]) < 1:
        return None
    if int(target[2]) * int(target[3]) != int(tokens[1]):
        return None
    chw = [c, int(target[2]), int(target[3])]
    chain, shapes, tensor = [], [], r1.output[0]
    names = {tensor}
    while True:
        users = _users(gr, tensor)
        if tensor in gr.protected:
            return None
        shapes += [u for u in users if _whole_shape(u)]
        data = [u for u in users if not _whole_shape(u)]
        if len(data) != 1:
            return None
        node = data[0]
        if node.op_type == "Reshape" and node.input[0] == tensor:
            break
        if (node.domain, node.op_type) not in _PER_CHANNEL or len(node.output) != 1:
            return None
        at = _PER_CHANNEL[(node.domain, node.op_type)]
        at = at if at is not None else next((k for k, i in enumerate(node.input) if i == tensor), -1)
        if node.input[at] != tensor or any(
            k != at and (i == "" or gr.consts.get(i) is None or _channel_vector(gr.consts.get(i), c) is None)
            for k, i in enumerate(node.input)
        ):
            return None
        chain.append((node, at))
        tensor = node.output[0]
        names.add(tensor)
    r2 = node
    users = _users(gr, r2.output[0])
    flat = [u for u in users if _whole_shape(u)]  # reading [N, C, H*W]
    ends = [u for u in users if u not in flat]
    if len(ends) != 1 or r2.output[0] in gr.protected or not chain:
        return None
    last = ends[0]
    if last.op_type != "Transpose" or _perm(last) != [0, 2, 1]:
        return None
    if not _flatten_target(gr, r2, names, c, chw[1] * chw[2]):
        return None
    return c, chw, chain, shapes, flat, [first, r1, r2, last]


def _drop_dead_shapes(g: onnx.GraphProto) -> None:
    """Remove shape-computing nodes whose outputs nothing reads (the flatten's target, once it goes)."""
    while True:
        used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        dead = [n for n in g.node
                if n.domain == "" and n.op_type in _SHAPE_OPS and not any(o in used for o in n.output)]
        if not dead:
            return
        ids = {id(n) for n in dead}
        keep = [n for n in g.node if id(n) not in ids]
        del g.node[:]
        g.node.extend(keep)


def patch_layout(model: onnx.ModelProto, keep=frozenset()) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with each patch GEMM's per-channel ops moved onto its [N, H*W, C] output; returns
    it and how many patch embeddings were. A pattern whose NCHW tensors are named in ``keep`` (intermediates a
    caller wants to read) is left as it is."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    done = 0
    gr = _Graph(g, keep)
    for first in [n for n in g.node if n.op_type == "Transpose"]:
        found = _match(gr, first)  # a Transpose a rewrite removed no longer reads a GEMM: no match
        if found is None:
            continue
        c, chw, chain, shapes, flat, gone = found
        tag = f"{first.output[0]}/nlc"
        tensor = first.input[0]
        new_nodes: dict[int, onnx.NodeProto] = {}
        for k, (node, at) in enumerate(chain):
            inputs = list(node.input)
            inputs[at] = tensor
            for j, name in enumerate(inputs):
                if j != at:
                    v = _channel_vector(gr.consts.get(name), c)
                    if v.shape != gr.consts.get(name).shape:
                        inputs[j] = f"{tag}/{k}/{j}"
                        g.initializer.append(numpy_helper.from_array(v, inputs[j]))
            output = gone[-1].output[0] if k == len(chain) - 1 else f"{tag}/{k}"
            fresh = helper.make_node(node.op_type, inputs, [output], name=node.name, domain=node.domain)
            fresh.attribute.extend(node.attribute)
            new_nodes[id(node)] = fresh
            tensor = output
        extra = []
        if shapes or flat:  # [N, C, H, W] and [N, C, H*W] from the batch of the GEMM's A (its output must
            dims = f"{tag}/shape"  # stay the GEMM's alone)
            for name, value in (("start", [0]), ("end", [1]), ("axis", [0]), ("chw", chw),
                                ("cl", [c, chw[1] * chw[2]])):
                g.initializer.append(numpy_helper.from_array(np.array(value, np.int64), f"{dims}/{name}"))
            extra = [
                helper.make_node("Shape", [gr.producer[first.input[0]].input[0]], [f"{dims}/nlk"],
                                 name=f"{dims}/nlk"),
                helper.make_node("Slice", [f"{dims}/nlk", f"{dims}/start", f"{dims}/end", f"{dims}/axis"],
                                 [f"{dims}/n"], name=f"{dims}/n"),
                helper.make_node("Concat", [f"{dims}/n", f"{dims}/chw"], [f"{dims}/nchw"],
                                 name=f"{dims}/nchw", axis=0),
                helper.make_node("Concat", [f"{dims}/n", f"{dims}/cl"], [f"{dims}/ncl"],
                                 name=f"{dims}/ncl", axis=0),
            ]
            for readers, value in ((shapes, f"{dims}/nchw"), (flat, f"{dims}/ncl")):
                for r in readers:
                    new_nodes[id(r)] = helper.make_node("Identity", [value], list(r.output), name=r.name)
        dropped = {id(n) for n in gone}
        nodes = []
        for n in g.node:
            if n is gone[0]:
                nodes += extra
            if id(n) not in dropped:
                nodes.append(new_nodes.get(id(n), n))
        del g.node[:]
        g.node.extend(nodes)
        renamed = {gone[0].output[0], gone[1].output[0], gone[2].output[0]} | {n.output[0] for n, _ in chain}
        kept = [v for v in g.value_info if v.name not in renamed and v.name != gone[-1].output[0]]
        del g.value_info[:]
        g.value_info.extend(kept)
        done += 1
        gr = _Graph(g, keep)
    if done:
        _drop_dead_shapes(g)
    return out, done


__all__ = ["patch_layout"]
