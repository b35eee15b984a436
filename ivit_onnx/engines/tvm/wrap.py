"""Keep wrap-around arithmetic, which TVM's code generation treats as undefined, out of the TVM graph.

TVM's llvm backend emits integer add/sub/mul with ``nsw`` (signed) or ``nuw`` (unsigned) flags, so any
wrap-around, unsigned included, is undefined behaviour that LLVM exploits: ``u + 2**63`` on uint64
compiles to ``u | 2**63``. The bodies' floor shift once read
``Cast<int64>((Cast<uint64>(t) + 2**63 >> c) - (2**63 >> c))``, relying on that wrap-around; that form
(still possible in hand-built graphs) becomes an arithmetic right shift of int64 ``t`` here (TVM's
BitShift RIGHT is arithmetic on signed types; ONNX allows BitShift on unsigned types only, so the result
is a TVM-only graph). Today's bodies bias by ``2**62`` in int64 and never wrap. Any unsigned Add/Sub/Mul
left is refused rather than risked.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ivit_onnx.graph import node_attrs

TOP = np.uint64(1 << 63)
_WRAPPING = ("Add", "Sub", "Mul")


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _attr(node: onnx.NodeProto, name: str, default=None):
    return node_attrs(node).get(name, default)


class _Matcher:
    """Finds ``Cast<int64>(Sub(BitShift(Add(Cast<uint64>(t), TOP), s), BitShift(TOP, s)))``."""

    def __init__(self, graph: onnx.GraphProto):
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consts = _constants(graph)

    def _node(self, name: str, op_type: str, **attrs):
        node = self.producer.get(name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        if any(_attr(node, k) != v for k, v in attrs.items()):
            return None
        return node

    def _is_top(self, name: str) -> bool:
        value = self.consts.get(name)
        if value is None or value.dtype != np.uint64 or value.size == 0:
            return False
        return bool(np.all(value == TOP))

    def match(self, cast: onnx.NodeProto) -> tuple[str, str] | None:
        """``(t, s)`` when ``cast`` ends a biased floor shift of ``t`` by ``s``, else None."""
        if cast.op_type != "Cast" or _attr(cast, "to") != TensorProto.INT64:
            return None
        sub = self._node(cast.input[0], "Sub")
        if sub is None:
            return None
        shifted = self._node(sub.input[0], "BitShift", direction=b"RIGHT")
        bias = self._node(sub.input[1], "BitShift", direction=b"RIGHT")
        if shifted is None or bias is None or shifted.input[1] != bias.input[1]:
            return None
        if not self._is_top(bias.input[0]):
            return None
        add = self._node(shifted.input[0], "Add")
        if add is None:
            return None
        lhs, rhs = add.input
        if self._is_top(lhs):
            lhs, rhs = rhs, lhs
        to_u64 = self._node(lhs, "Cast", to=TensorProto.UINT64)
        if not self._is_top(rhs) or to_u64 is None:
            return None
        return to_u64.input[0], shifted.input[1]


def _subgraph_inputs(graph: onnx.GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                names.update(i for n in sub.node for i in n.input)
                names |= _subgraph_inputs(sub)
    return names


def _drop_dead(graph: onnx.GraphProto) -> None:
    needed = {o.name for o in graph.output} | _subgraph_inputs(graph)
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output) or not node.output:
            keep.append(node)
            needed.update(i for i in node.input if i)
    del graph.node[:]
    graph.node.extend(reversed(keep))


def rewrite_biased_shifts(model: onnx.ModelProto) -> int:
    """Replace each biased uint64 floor shift (top-level graph) by an int64 arithmetic shift, in place."""
    graph = model.graph
    matcher = _Matcher(graph)
    new_nodes, count = [], 0
    for node in graph.node:
        found = matcher.match(node)
        if found is None:
            new_nodes.append(node)
            continue
        t, s = found
        out = node.output[0]
        new_nodes += [helper.make_node("Cast", [t], [f"{out}/t64"], to=TensorProto.INT64),
                      helper.make_node("Cast", [s], [f"{out}/s64"], to=TensorProto.INT64),
                      helper.make_node("BitShift", [f"{out}/t64", f"{out}/s64"], [out], direction="RIGHT",
                                       name=f"{node.name or out}/arithmetic_shift")]
        count += 1
    del graph.node[:]
    graph.node.extend(new_nodes)
    if count:
        _drop_dead(graph)
    return count


def unsigned_arithmetic(model: onnx.ModelProto) -> list[str]:
    """``name (op_type)`` of the top-level Add/Sub/Mul nodes that compute in an unsigned integer type."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(inferred.input) + list(inferred.value_info) + list(inferred.output)}
    types.update({i.name: i.data_type for i in model.graph.initializer})
    unsigned = {TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}
    return [f"{n.name or n.output[0]} ({n.op_type})" for n in model.graph.node
            if n.op_type in _WRAPPING and types.get(n.output[0]) in unsigned]
