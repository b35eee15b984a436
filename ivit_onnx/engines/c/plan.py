"""The C engine's view of an integer model: static shapes for one sample, what is constant (folded now),
what the entry reads and writes, which tensors share storage, and the arena plan from their liveness.

The model runs once on the interpreter (``onnx.reference`` with the reference kernels) at batch 1: every
tensor's shape and dtype, and the value of every tensor that does not depend on the input's values
(initializers, Shape and what is computed from them) come from that run. The entry's inputs are what the
input QuantizeLinear writes (or an integer graph input), its outputs what the output DequantizeLinear reads
(or an integer graph output); nothing in between may be float.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from ivit_onnx.errors import ConversionError

#: ops whose output is their first input's bytes under another shape: they share its storage
ALIASES = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
#: ops whose output depends on the input's shape only
SHAPE_ONLY = {"Shape", "Size"}
ALIGN = 8


@dataclass
class Boundary:
    """An entry argument: the graph tensor it stands for and its Q/DQ parameters (None for an integer
    graph input or output)."""

    graph_name: str
    tensor: str
    shape: tuple
    dtype: np.dtype
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None


@dataclass
class Plan:
    model: onnx.ModelProto
    values: dict[str, np.ndarray]  # every tensor from the batch-1 run (shapes, dtypes, constants)
    constant: set[str]
    nodes: list[onnx.NodeProto]  # the nodes the entry runs, in order
    inputs: list[Boundary]
    outputs: list[Boundary]
    root: dict[str, str] = field(default_factory=dict)  # tensor -> the tensor whose storage it uses
    offset: dict[str, int] = field(default_factory=dict)  # storage root -> arena byte offset
    arena_bytes: int = 0

    def shape(self, name: str) -> tuple:
        return tuple(self.values[name].shape)

    def dtype(self, name: str) -> np.dtype:
        return self.values[name].dtype


def _node_name(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}->{node.output[0]}"


def fix_batch(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs have the static ``shapes``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[vi.name], strict=True):
                d.ClearField("dim_param")
                d.dim_value = int(v)
    return out


def _run_once(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    from ivit_onnx.opset.reference import evaluator
    from ivit_onnx.runners import graph_inputs

    feeds = {}
    for vi in graph_inputs(model):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        feeds[vi.name] = np.zeros(shapes[vi.name], dtype)
    every = evaluator(model).run(None, feeds, intermediate=True)
    values = {k: np.asarray(v) for k, v in every.items()}
    values.update({t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer})
    values.update(feeds)
    return values


def plan(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> Plan:
    """Analyse ``model`` for one sample of ``shapes`` (each input's shape, batch 1)."""
    from ivit_onnx.runners import graph_inputs

    model = fix_batch(model, shapes)
    values = _run_once(model, shapes)
    dynamic = {vi.name for vi in graph_inputs(model)}
    for node in model.graph.node:
        if node.op_type not in SHAPE_ONLY and any(i in dynamic for i in node.input if i):
            dynamic.update(o for o in node.output if o)
    constant = set(values) - dynamic
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)

    skip: set[int] = set()
    inputs = []
    for vi in graph_inputs(model):
        users = consumers.get(vi.name, [])
        if values[vi.name].dtype.kind == "f":
            if len(users) != 1 or users[0].op_type != "QuantizeLinear":
                raise ConversionError(
                    f"input '{vi.name}': a float input must feed one QuantizeLinear only "
                    "(the C engine reads the quantized input)"
                )
            q = users[0]
            skip.add(id(q))
            zp = values[q.input[2]] if len(q.input) > 2 and q.input[2] else np.uint8(0)
            inputs.append(
                Boundary(
                    vi.name,
                    q.output[0],
                    tuple(values[q.output[0]].shape),
                    values[q.output[0]].dtype,
                    values[q.input[1]],
                    zp,
                )
            )
        else:
            inputs.append(Boundary(vi.name, vi.name, tuple(values[vi.name].shape), values[vi.name].dtype))
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = []
    for vo in model.graph.output:
        node = producer.get(vo.name)
        if values[vo.name].dtype.kind == "f":
            if node is None or node.op_type != "DequantizeLinear":
                raise ConversionError(
                    f"output '{vo.name}': a float output must come from a DequantizeLinear "
                    "(the C engine writes the integer output)"
                )
            skip.add(id(node))
            zp = values[node.input[2]] if len(node.input) > 2 and node.input[2] else np.uint8(0)
            x = node.input[0]
            outputs.append(
                Boundary(vo.name, x, tuple(values[x].shape), values[x].dtype, values[node.input[1]], zp)
            )
        else:
            outputs.append(Boundary(vo.name, vo.name, tuple(values[vo.name].shape), values[vo.name].dtype))

    needed = {b.tensor for b in outputs}
    for n in reversed(model.graph.node):  # what the outputs depend on
        if any(o in needed for o in n.output):
            needed.update(i for i in n.input if i)
    nodes = [
        n
        for n in model.graph.node
        if id(n) not in skip and any(o in dynamic and o in needed for o in n.output)
    ]
    for n in nodes:
        for name in list(n.input) + list(n.output):
            if name in dynamic and name in values and values[name].dtype.kind == "f":
                raise ConversionError(
                    f"node '{_node_name(n)}' ({n.op_type}): tensor '{name}' is float; the C "
                    "engine runs integer-only models (convert with 'ivit-onnx rewrite')"
                )
    p = Plan(model, values, constant, nodes, inputs, outputs)
    _storage(p)
    return p


def _storage(p: Plan) -> None:
    """Aliases share their source's storage; the rest get arena offsets by first fit over live ranges."""
    entry = {b.tensor for b in p.inputs}
    for b in p.inputs:
        p.root[b.tensor] = b.tensor
    for n in p.nodes:
        for o in n.output:
            if not o:
                continue
            src = n.input[0] if n.op_type in ALIASES and n.input[0] not in p.constant else None
            p.root[o] = p.root[src] if src is not None else o
    end = len(p.nodes)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, n in enumerate(p.nodes):
        for o in n.output:
            if o and p.root[o] == o:
                first[o] = k
        for i in n.input:
            if i in p.root:
                r = p.root[i]
                last[r] = max(last.get(r, -1), k)
    for b in p.outputs:
        last[p.root[b.tensor]] = end
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    for name in sorted(first, key=lambda t: first[t]):
        if name in entry:
            continue
        size = -(-p.values[name].nbytes // ALIGN) * ALIGN
        lo, hi = first[name], last.get(name, first[name])
        busy = sorted((o, s) for o, s, f, la in placed if not (la < lo or f > hi))
        off = 0
        for o, s in busy:
            if off + size <= o:
                break
            off = max(off, o + s)
        placed.append((off, size, lo, hi))
        p.offset[name] = off
    p.arena_bytes = max((o + s for o, s, _, _ in placed), default=0)
