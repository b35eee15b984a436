"""Graph helpers shared by the passes and the engines: producers, consumers, constants, QDQ look-through
(onnx-graphsurgeon), and readers of ONNX protos (:func:`input_uses`, :func:`node_attrs`)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs


def producer(t: gs.Tensor) -> gs.Node | None:
    return t.inputs[0] if t.inputs else None


def only_consumer(t: gs.Tensor) -> gs.Node | None:
    return t.outputs[0] if len(t.outputs) == 1 else None


def constant(name: str, value) -> gs.Constant:
    """A graph constant of ``value`` with its shape kept: numpy arithmetic on 0-d arrays yields numpy scalars,
    which onnx-graphsurgeon refuses, and ``np.ascontiguousarray`` would make them 1-d."""
    return gs.Constant(name, np.require(np.asarray(value), requirements="C"))


def const_array(t: gs.Tensor | None) -> np.ndarray | None:
    """The value of a constant tensor (initializer or Constant node output), else None."""
    if t is None:
        return None
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    p = producer(t)
    if p is not None and p.op == "Constant" and "value" in p.attrs:
        return np.asarray(p.attrs["value"].values)
    return None


def node_label(node: gs.Node) -> str:
    """How messages name a node: ``OpType 'name'``."""
    return f"{node.op} '{node.name or (node.outputs[0].name if node.outputs else '?')}'"


def is_qdq_pair(t: gs.Tensor) -> bool:
    """``t`` is the output of DequantizeLinear(QuantizeLinear(x)) with x a variable."""
    dq = producer(t)
    if dq is None or dq.op != "DequantizeLinear":
        return False
    q = producer(dq.inputs[0])
    return q is not None and q.op == "QuantizeLinear"


def through_qdq(t: gs.Tensor) -> gs.Tensor:
    """Step up through Q→DQ pairs (ORT puts them inside decomposed GELU/LayerNorm): the float source."""
    while is_qdq_pair(t):
        t = producer(producer(t).inputs[0]).inputs[0]
    return t


def consumers_through_qdq(t: gs.Tensor) -> list[tuple[gs.Node, gs.Tensor]]:
    """Consumers of ``t``, stepping down through Q→DQ pairs; each with the tensor it reads."""
    out = []
    for c in t.outputs:
        if c.op == "QuantizeLinear":
            for dq in c.outputs[0].outputs:
                if dq.op == "DequantizeLinear":
                    out.extend(consumers_through_qdq(dq.outputs[0]))
                else:
                    out.append((dq, c.outputs[0]))
        else:
            out.append((c, t))
    return out


def scalar_const(t: gs.Tensor) -> float | None:
    """A float scalar constant (also through a DequantizeLinear of a constant), else None."""
    v = dequantized_const(t)
    if v is None or v.size != 1:
        return None
    return float(v.reshape(()))


def dequantized_const(t: gs.Tensor) -> np.ndarray | None:
    """The float value of a constant, or of DequantizeLinear(constant) (ORT quantizes constants too)."""
    v = const_array(t)
    if v is not None:
        return v
    p = producer(t)
    if p is None or p.op != "DequantizeLinear":
        return None
    q = const_array(p.inputs[0])
    s = const_array(p.inputs[1])
    if q is None or s is None:
        return None
    zp = const_array(p.inputs[2]) if len(p.inputs) > 2 else None
    zp = np.zeros((), q.dtype) if zp is None else zp
    axis = p.attrs.get("axis", 1)
    if s.size > 1:
        shape = [1] * q.ndim
        shape[axis] = s.size
        s, zp = s.reshape(shape), zp.reshape(shape)
    return ((q.astype(np.float64) - zp.astype(np.float64)) * s).astype(np.float32)


def replace_uses(old: gs.Tensor, new: gs.Tensor, graph: gs.Graph | None = None) -> None:
    """Make every consumer of ``old`` (and the graph outputs, if given) read ``new`` instead."""
    for node in list(old.outputs):
        for i, t in enumerate(node.inputs):
            if t is old:
                node.inputs[i] = new
    if graph is not None:
        graph.outputs = [new if t is old else t for t in graph.outputs]


def detach(node: gs.Node) -> None:
    """Disconnect ``node`` from its tensors by identity (gs's list sync compares nodes with a slow ``==``)."""
    for t in node.inputs:
        keep = [n for n in t.outputs if n is not node]
        list.clear(t.outputs)
        list.extend(t.outputs, keep)
    for t in node.outputs:
        keep = [n for n in t.inputs if n is not node]
        list.clear(t.inputs)
        list.extend(t.inputs, keep)
    list.clear(node.inputs)
    list.clear(node.outputs)


def input_uses(g) -> dict[str, list[tuple]]:
    """``(node, input index)`` of every use of each tensor in an ``onnx.GraphProto``: the session-time
    rewrites (bias fold, uint8 re-encoding, chain fold) edit the proto directly, not a graphsurgeon graph."""
    uses: dict[str, list[tuple]] = {}
    for node in g.node:
        for k, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node, k))
    return uses


def node_attrs(node) -> dict:
    """An ONNX NodeProto's attributes as ``{name: python value}``."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}
