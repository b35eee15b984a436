"""Small matching helpers shared by the fusion passes (not a pass)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ivit_onnx.graph import const_array, producer, through_qdq


def reduce_axes(node: gs.Node) -> list[int] | None:
    """The axes of a Reduce* node (attribute before opset 18, input after), None if not constant."""
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(node.inputs) > 1:
        v = const_array(node.inputs[1])
        return None if v is None else [int(a) for a in v.ravel()]
    return None


def is_last_axis(axes: list[int] | None, t: gs.Tensor) -> bool:
    if axes is None or len(axes) != 1:
        return False
    rank = len(t.shape) if t.shape is not None else None
    return axes[0] == -1 or (rank is not None and axes[0] == rank - 1)


def src(t: gs.Tensor, op: str | tuple[str, ...]) -> gs.Node | None:
    """The producer of ``t`` (through Q/DQ pairs) if it is one of ``op``."""
    p = producer(through_qdq(t))
    ops = (op,) if isinstance(op, str) else op
    return p if p is not None and p.op in ops else None


def other_input(node: gs.Node, t: gs.Tensor) -> gs.Tensor:
    """The operand of a binary node that is not (the Q/DQ-stripped) ``t``."""
    a, b = node.inputs[0], node.inputs[1]
    return b if through_qdq(a) is through_qdq(t) else a
