"""Fold a Requantize and the elementwise private ops after it into one table lookup, for the native library.

The converter writes ``Requantize -> Requantize -> ShiftGELU`` after every MLP GEMM and ``Requantize ->
Requantize -> Shiftmax`` after every attention-score GEMM: an int32 accumulator narrowed to 8 bits, widened
again to the nonlinearity's input scale, then the nonlinearity, three passes over the biggest tensors of the
model. The first Requantize's output takes only ``qmax - qmin + 1`` values (256 for 8 bits), so everything
elementwise after it is a function of that value: a table, computed here by the numpy reference kernels (the
normative definition) over every possible value. The library's fused ops (domain ``ai.ivit.fused``,
``opset/native/ort_ops.cpp``) then rescale once and look up:

* ``RequantizeTable(x, zx, b, c, zy, table)``: ``table[Requantize(x) - qmin]``;
* ``RequantizeShiftmax(x, zx, b, c, zy, table, y_zero_point)``: the Shiftmax of those looked-up values, in
  the same pass over each row;
* ``RequantizeShiftmaxTable(..., y_zero_point, post)``: then the elementwise ops after the Shiftmax (the
  Requantize onnxruntime ``quantize_static`` models put there) as ``post[value - y_zero_point]``, a table over
  the Shiftmax's ``2**bits + 1`` values (``bits <= 16``).

A head whose outputs are too many to tabulate (the converter's upscale to int32 before a GELU, after an
IAdd in onnxruntime ``quantize_static`` models) but whose input is 8- or 16-bit is tabulated over its input
instead: the RequantizeTable then has an identity Requantize (``x`` over its type's range) and the table is
the head and its chain applied to every value of that type.

Exact by construction: a table entry is the reference chain applied to that input. Folded: a Requantize
with constant parameters and at most :data:`MAX_TABLE` outputs, then one consumer at a time (no graph
outputs, nothing in ``keep``) that is a Requantize, ShiftGELU or IBertGELU with constant per-tensor
parameters, and optionally a Shiftmax (then the first Requantize must be per tensor too). Applied at session
time, like
:mod:`.bias_fold`, to the model the library runs; the converted model keeps its ops.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ivit_onnx.graph import input_uses
from ivit_onnx.opset import DOMAIN, OPS

FUSED_DOMAIN = "ai.ivit.fused"
#: largest table (entries): a 16-bit intermediate at most
MAX_TABLE = 1 << 16
#: the most Shiftmax output bits a table after it takes (2**bits + 1 entries)
MAX_POST_BITS = 16
#: elementwise private ops a table can absorb: op_type -> indices of their parameter inputs
ELEMENTWISE = {"Requantize": (1, 2, 3, 4), "ShiftGELU": (1, 2, 3), "IBertGELU": (1, 2, 3)}


def _attrs(node: onnx.NodeProto) -> dict[str, int]:
    return {a.name: int(a.i) for a in node.attribute}


class _Graph:
    """Constants, consumers and protected names of a graph, for matching chains."""

    def __init__(self, g: onnx.GraphProto, keep) -> None:
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.consumers = input_uses(g)
        self.protected = {o.name for o in g.output} | set(keep)

    def params(self, node: onnx.NodeProto, at, scalar: bool) -> list[np.ndarray] | None:
        """The constant inputs ``at`` of ``node`` (each a single value of rank 0 or 1 if ``scalar``: one that
        cannot raise the output's rank), or None."""
        vals = [self.consts.get(node.input[i]) if i < len(node.input) else None for i in at]
        if any(v is None or (scalar and (v.size != 1 or v.ndim > 1)) for v in vals):
            return None
        return vals

    def next_op(self, tensor: str) -> onnx.NodeProto | None:
        """The only consumer of ``tensor``, if a private op reads it as input 0 and nothing protects it."""
        uses = self.consumers.get(tensor, [])
        if (
            tensor in self.protected
            or len(uses) != 1
            or uses[0][0].domain != DOMAIN
            or uses[0][1] != 0
        ):
            return None
        return uses[0][0]


def _chain(gr: _Graph, head: onnx.NodeProto):
    """``(elementwise nodes after head, the Shiftmax ending the chain or None)``."""
    chain, node = [], gr.next_op(head.output[0])
    while (
        node is not None and node.op_type in ELEMENTWISE and gr.params(node, ELEMENTWISE[node.op_type], True)
    ):
        chain.append(node)
        node = gr.next_op(node.output[0])
    softmax = (
        node if node is not None and node.op_type == "Shiftmax" and gr.params(node, (1,), True) else None
    )
    return chain, softmax


def _through(gr: _Graph, nodes, values: np.ndarray) -> np.ndarray:
    """``values`` through the elementwise ``nodes`` by their reference kernels, flat."""
    for node in nodes:
        values = OPS[node.op_type].run(
            values, *gr.params(node, ELEMENTWISE[node.op_type], True), **_attrs(node)
        )
    return values.reshape(-1)


def _table(gr: _Graph, head: onnx.NodeProto, chain: list[onnx.NodeProto]) -> np.ndarray:
    """The chain's reference output for every value ``head`` can produce, in order from qmin."""
    a = _attrs(head)
    return _through(gr, chain, np.arange(a["qmin"], a["qmax"] + 1).astype(gr.consts[head.input[4]].dtype))


def _input_table(gr: _Graph, head: onnx.NodeProto, types: dict) -> np.ndarray | None:
    """Every value of ``head``'s input type, where that type is 8- or 16-bit (its zero point's, and the
    graph's declared type where it has one) and the head is per tensor; else None."""
    if gr.params(head, (1, 2, 3, 4), True) is None:
        return None
    dt = gr.consts[head.input[1]].dtype
    declared = types.get(head.input[0])
    if dt not in (np.int8, np.uint8, np.int16) or (
        declared and declared != helper.np_dtype_to_tensor_dtype(dt)
    ):
        return None
    info = np.iinfo(dt)
    return np.arange(info.min, info.max + 1).astype(dt)


def fold_chains(model: onnx.ModelProto, keep=frozenset()) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` with every eligible chain folded; returns it and how many were folded.

    Tensors named in ``keep`` (intermediates a caller wants to read) are never folded away.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    gr = _Graph(g, keep)
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.input, *g.output)}
    dead: set[int] = set()
    replace: dict[int, onnx.NodeProto] = {}
    for head in g.node:
        if head.domain != DOMAIN or head.op_type != "Requantize" or id(head) in dead or len(head.input) != 5:
            continue
        a = _attrs(head)
        if gr.params(head, (1, 2, 3, 4), False) is None:
            continue
        chain, softmax = _chain(gr, head)
        name = f"{head.name or head.output[0]}_chain_table"
        if not 0 < a["qmax"] - a["qmin"] + 1 <= MAX_TABLE:  # too many outputs: over the input, if it can
            x = _input_table(gr, head, types) if chain else None
            if x is None:
                continue
            info, zero = np.iinfo(x.dtype), np.zeros((), x.dtype)
            ident = {"_zx": zero, "_b": np.int64(1), "_c": np.int64(0), "_zy": zero}
            g.initializer.extend(numpy_helper.from_array(np.asarray(v), name + k) for k, v in ident.items())
            g.initializer.append(numpy_helper.from_array(_through(gr, (head, *chain), x), name))
            replace[id(head)] = helper.make_node(
                "RequantizeTable", [head.input[0], *(name + k for k in ident), name], [chain[-1].output[0]],
                name=f"{head.name}_fused", domain=FUSED_DOMAIN, qmin=int(info.min), qmax=int(info.max),
            )
            dead.update(id(n) for n in chain)
            continue
        if softmax is not None and gr.params(head, (1, 2, 3, 4), True) is None:
            softmax = None  # the fused Shiftmax takes a per-tensor Requantize only
        if not chain and softmax is None:
            continue
        table = _table(gr, head, chain)
        after: list[onnx.NodeProto] = []
        if softmax is not None:
            g.initializer.append(numpy_helper.from_array(table.astype(np.int32), name))
            last, op = softmax, "RequantizeShiftmax"
            inputs = [*head.input, name, softmax.input[1]]
            attrs = {**a, **_attrs(softmax)}
            after = _chain(gr, softmax)[0] if attrs["bits"] <= MAX_POST_BITS else []
            if after:  # the ops after it, over its 2**bits + 1 values
                zo = gr.consts[softmax.input[1]]
                values = (np.arange((1 << attrs["bits"]) + 1) + int(zo.reshape(-1)[0])).astype(zo.dtype)
                g.initializer.append(numpy_helper.from_array(_through(gr, after, values), f"{name}_post"))
                last, op = after[-1], "RequantizeShiftmaxTable"
                inputs.append(f"{name}_post")
        else:
            g.initializer.append(numpy_helper.from_array(table, name))
            last, op, inputs, attrs = chain[-1], "RequantizeTable", [*head.input, name], a
        fused = helper.make_node(
            op, inputs, [last.output[0]], name=f"{head.name}_fused", domain=FUSED_DOMAIN, **attrs
        )
        replace[id(head)] = fused
        dead.update(id(n) for n in (*chain, *([softmax] if softmax is not None else []), *after))
    if not replace:
        return out, 0
    gone = {name for n in g.node if id(n) in dead or id(n) in replace for name in n.input}
    nodes = [replace.get(id(n), n) for n in g.node if id(n) not in dead]
    del g.node[:]
    g.node.extend(nodes)
    if not any(a.g.node or a.graphs for n in nodes for a in n.attribute):  # no subgraph may read them
        used = {name for n in nodes for name in n.input} | {o.name for o in g.output}
        kept = [t for t in g.initializer if t.name not in gone or t.name in used]  # folded params go
        del g.initializer[:]
        g.initializer.extend(kept)
    out.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, 1))
    return out, len(replace)


__all__ = ["FUSED_DOMAIN", "MAX_TABLE", "fold_chains"]
