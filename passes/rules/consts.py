"""The value of a tensor computed from constants only, evaluated at conversion time with onnx.reference.

Exporters build some constant operands through small subgraphs (TorchScript's pads of ``F.pad``, a mask
unsqueezed twice): rules that need the numbers (and TVM, which wants constant pads) get them here.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx.reference import ReferenceEvaluator

from ivit_onnx.graph import const_array, producer

#: the walk up from a tensor stops after this many tensors: constant operands (pads, masks) come from a few
#: nodes, and a residual stream's operand is not walked back through the whole graph for every Add
MAX_NODES = 64


def _subgraph(t: gs.Tensor, nodes: list, seen: set) -> bool:
    """Collect the nodes computing ``t`` from constants (topological order); False if a variable feeds it."""
    if isinstance(t, gs.Constant) or t.name in seen:
        return True
    node = producer(t)
    if node is None or len(seen) >= MAX_NODES or node.op in ("QuantizeLinear", "DequantizeLinear"):
        return False
    seen.add(t.name)
    if not all(_subgraph(x, nodes, seen) for x in node.inputs if x.name):
        return False
    nodes.append(node)
    return True


def constant_value(t: gs.Tensor, opset: int) -> np.ndarray | None:
    """``t``'s value when only constants feed it (a plain constant included), else None."""
    v = const_array(t)
    if v is not None:
        return v
    nodes: list[gs.Node] = []
    if not _subgraph(t, nodes, set()) or not nodes:
        return None
    graph = gs.Graph(nodes=nodes, inputs=[], outputs=[t], opset=opset)  # the same nodes: nothing is copied
    model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = 10
    try:
        return np.asarray(ReferenceEvaluator(model).run(None, {})[0])
    except Exception:  # noqa: BLE001 - anything onnx.reference cannot evaluate is simply not folded
        return None
