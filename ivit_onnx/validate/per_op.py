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


def _sources(model: onnx.ModelProto, tmap: dict, start: str, consts: set[str]):
    """The nodes between ``start``'s producer and the mapped tensors or graph inputs upstream of it
    (topological order), and those tensors (a graph input is fed as validate feeds it: a token mask)."""
    prod = {o: n for n in model.graph.node for o in n.output}
    inputs = {i.name for i in model.graph.input}
    nodes, sources, todo, seen = [], set(), [start], set()
    while todo:
        t = todo.pop()
        if t in seen or not t or t in consts:
            continue
        seen.add(t)
        if t != start and (t in tmap or t in inputs):
            sources.add(t)
            continue
        node = prod.get(t)
        if node is None:
            return None
        nodes.append(node)
        todo += list(node.input)
    order = {id(n): i for i, n in enumerate(model.graph.node)}
    unique = {id(n): n for n in nodes}
    return sorted(unique.values(), key=lambda n: order[id(n)]), sorted(sources)


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
    model: onnx.ModelProto, feeds: dict, fq_values: dict, tmap: dict
) -> tuple[list[OpRow], list[str]]:
    """The rows of every approximating kernel whose output replaces a fake-quant tensor, and the kernels
    skipped with why. ``feeds``: the batch; ``fq_values``: the fake-quant model's tensors on it (every
    ``replaces`` of :func:`needed`)."""
    from ivit_onnx.runners import make_runner

    consts = {t.name for t in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    rows, skipped = [], []
    for node in model.graph.node:
        if node.op_type not in APPROXIMATING:
            continue
        out = node.output[0]
        entry = tmap.get(out)
        got = _sources(model, tmap, out, consts) if entry else None
        if entry is None or got is None or entry["replaces"] not in fq_values:
            skipped.append(f"{node.op_type} '{node.name}': its output or input replaces no fake-quant tensor")
            continue
        nodes, sources = got
        mapped = [s for s in sources if s in tmap]
        fed = set(sources) - set(mapped) <= set(feeds)
        if any(tmap[s]["replaces"] not in fq_values for s in mapped) or not fed:
            skipped.append(f"{node.op_type} '{node.name}': an input's fake-quant tensor was not computed")
            continue
        inputs = {s: _quantize(fq_values[tmap[s]["replaces"]], tmap[s]) if s in tmap else feeds[s]
                  for s in sources}
        sub = _submodel(model, nodes, inputs, out)
        got_y = next(iter(make_runner("functions", sub).run(inputs).values())).astype(np.int64)
        ref = _quantize(fq_values[entry["replaces"]], entry).astype(np.int64)
        diff = np.abs(got_y - np.broadcast_to(ref, got_y.shape))
        rows.append(OpRow(node.op_type, node.name, entry["replaces"], int(diff.size),
                          float(np.mean(diff == 0)), float(diff.mean()), int(diff.max(initial=0))))
    return rows, skipped


def needed(model: onnx.ModelProto, tmap: dict) -> list[str]:
    """The fake-quant tensors :func:`per_op` reads (the kernels' outputs and their mapped sources)."""
    consts = {t.name for t in model.graph.initializer}
    names = set()
    for node in model.graph.node:
        if node.op_type in APPROXIMATING and node.output[0] in tmap:
            names.add(tmap[node.output[0]]["replaces"])
            got = _sources(model, tmap, node.output[0], consts)
            names |= {tmap[s]["replaces"] for s in (got[1] if got else []) if s in tmap}
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
