"""``validate --per-op``: each nonlinear kernel's own error, fed the fake-quant model's integers.

For every Softmax / GELU / LayerNorm / L2-norm kernel (``qparams.BY_OP``, IL2Norm too) of the integer model,
the nearest tensors upstream that replace a fake-quant tensor (the tensor map) are set to that fake-quant
tensor's values, quantized with their integer types, and only the integer nodes between them and the kernel's
output run (the function bodies: exact integers). The result is compared with the fake-quant model's own
float op output quantized into the kernel's output type: the difference, in output LSB, is the kernel's error
and nothing upstream's (``--per-layer`` shows the error accumulated through the model instead).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import helper

from ivit_onnx.affine import dtype_range

#: the private ops that approximate a float function (the exact ones, Requantize and IAdd, are not listed)
APPROXIMATING = ("Shiftmax", "IBertSoftmax", "LogIntSoftmax", "ShiftGELU", "IBertGELU", "ILayerNorm",
                 "L1LayerNorm", "IL2Norm")  # fmt: skip


@dataclass
class OpRow:
    """One kernel node: its error against the float op followed by its quantize, in output LSB."""

    op: str
    node: str
    replaces: str  #: the fake-quant tensor its output replaces
    elements: int
    exact: float  #: the share of output elements equal to the reference
    mean_lsb: float
    max_lsb: int

    def as_dict(self) -> dict:
        return asdict(self)


def _quantize(x: np.ndarray, entry: dict) -> np.ndarray:
    """``x`` on a tensor-map entry's integer grid (half to even, saturated), as QuantizeLinear writes it."""
    dtype = np.dtype(entry["dtype"])
    scale = np.asarray(entry["scale"], np.float64)
    lo, hi = dtype_range(dtype)
    q = np.rint(np.asarray(x, np.float64) / scale) + entry.get("zero_point", 0)
    return np.clip(q, lo, hi).astype(dtype)


@dataclass
class Kernel:
    """One approximating kernel node and what runs it alone: the nodes from its sources (mapped tensors or
    graph inputs) to its output, in topological order; ``nodes`` is None where a path reaches neither."""

    node: onnx.NodeProto
    nodes: list | None
    sources: list[str]


def kernels(model: onnx.ModelProto, tmap: dict) -> list[Kernel]:
    """Every approximating kernel, with its upstream plan where its output replaces a fake-quant tensor."""
    prod = {o: n for n in model.graph.node for o in n.output}
    order = {id(n): i for i, n in enumerate(model.graph.node)}
    inputs = {i.name for i in model.graph.input}
    consts = {t.name for t in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    out = []
    for node in model.graph.node:
        if node.op_type in APPROXIMATING:  # one whose output replaces nothing is listed as skipped
            out.append(_plan(node, prod, order, inputs, consts, tmap) if node.output[0] in tmap
                       else Kernel(node, None, []))
    return out


def _plan(node, prod: dict, order: dict, inputs: set[str], consts: set[str], tmap: dict) -> Kernel:
    start = node.output[0]
    nodes, sources, todo, seen = {}, set(), [start], set()
    while todo:
        t = todo.pop()
        if t in seen or not t or t in consts:
            continue
        seen.add(t)
        if t != start and (t in tmap or t in inputs):
            sources.add(t)
            continue
        producer = prod.get(t)
        if producer is None:
            return Kernel(node, None, [])
        nodes[id(producer)] = producer
        todo += list(producer.input)
    return Kernel(node, sorted(nodes.values(), key=lambda n: order[id(n)]), sorted(sources))


def _submodel(model: onnx.ModelProto, nodes: list, feeds: dict, out: str):
    """The ``nodes`` as a model of their own: ``feeds``' tensors as inputs, ``out`` as the output."""
    used = {i for n in nodes for i in n.input}
    inits = [t for t in model.graph.initializer if t.name in used]
    ttype = helper.np_dtype_to_tensor_dtype
    inputs = [helper.make_tensor_value_info(k, ttype(v.dtype), None) for k, v in feeds.items()]
    outputs = [helper.make_empty_tensor_value_info(out)]
    graph = helper.make_graph(list(nodes), "per_op", inputs, outputs, inits)
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    sub.functions.extend(model.functions)
    return sub


def per_op(
    model: onnx.ModelProto, plans: list[Kernel], feeds: dict, fq_values: dict, tmap: dict
) -> tuple[list[OpRow], list[str]]:
    """The rows of the kernels of ``plans`` (:func:`kernels`), and those skipped with why. ``feeds``: the
    batch; ``fq_values``: the fake-quant model's tensors on it (:func:`needed`)."""
    from ivit_onnx.runners import make_runner

    rows, skipped = [], []
    for k in plans:
        node, out = k.node, k.node.output[0]
        entry = tmap.get(out)
        if k.nodes is None or entry["replaces"] not in fq_values:
            skipped.append(f"{node.op_type} '{node.name}': its output or input replaces no fake-quant tensor")
            continue
        mapped = [s for s in k.sources if s in tmap]
        fed = set(k.sources) - set(mapped) <= set(feeds)
        if any(tmap[s]["replaces"] not in fq_values for s in mapped) or not fed:
            skipped.append(f"{node.op_type} '{node.name}': an input's fake-quant tensor was not computed")
            continue
        inputs = {s: _quantize(fq_values[tmap[s]["replaces"]], tmap[s]) if s in tmap else feeds[s]
                  for s in k.sources}
        sub = _submodel(model, k.nodes, inputs, out)
        got_y = next(iter(make_runner("functions", sub).run(inputs).values())).astype(np.int64)
        ref = _quantize(fq_values[entry["replaces"]], entry).astype(np.int64)
        diff = np.abs(got_y - np.broadcast_to(ref, got_y.shape))
        rows.append(OpRow(node.op_type, node.name, entry["replaces"], int(diff.size),
                          float(np.mean(diff == 0)), float(diff.mean()), int(diff.max(initial=0))))
    return rows, skipped


def needed(plans: list[Kernel], tmap: dict) -> list[str]:
    """The fake-quant tensors :func:`per_op` reads (the kernels' outputs and their mapped sources)."""
    names = set()
    for k in (k for k in plans if k.nodes is not None):
        names |= {tmap[t]["replaces"] for t in (k.node.output[0], *k.sources) if t in tmap}
    return sorted(names)


def summary(rows: list[OpRow]) -> dict[str, dict]:
    """Per op type: nodes, the worst node's max LSB, the mean LSB and exact share over all its elements."""
    out: dict[str, dict] = {}
    for op in sorted({r.op for r in rows}):
        mine = [r for r in rows if r.op == op]
        n = sum(r.elements for r in mine)
        out[op] = {
            "nodes": len(mine),
            "max_lsb": max(r.max_lsb for r in mine),
            "mean_lsb": sum(r.mean_lsb * r.elements for r in mine) / n,
            "exact": sum(r.exact * r.elements for r in mine) / n,
        }
    return out
