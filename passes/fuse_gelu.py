"""fuse_gelu: collapse decomposed GELU (erf and tanh forms, any Mul order, Q/DQ pairs inside) into Gelu.

The fused node is the standard ``Gelu`` (``approximate`` "none"/"tanh"), an in-pipeline marker that
``lower_integer`` turns into ShiftGELU; Q/DQ pairs ORT placed inside the pattern are dropped with it.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ivit_onnx.graph import consumers_through_qdq, producer, scalar_const, through_qdq
from ivit_onnx.pipeline import Context, Pass


def _near(v: float | None, target: float, tol: float = 2e-3) -> bool:
    return v is not None and abs(v - target) <= tol * abs(target)


def _split_const(node: gs.Node) -> tuple[gs.Tensor | None, float | None]:
    """For a binary node with one scalar-constant operand: (the other operand, the constant)."""
    for i, j in ((0, 1), (1, 0)):
        c = scalar_const(node.inputs[j])
        if c is not None:
            return node.inputs[i], c
    return None, None


def _single_consumer(t: gs.Tensor, op: str) -> tuple[gs.Node, gs.Tensor] | None:
    cons = consumers_through_qdq(t)
    if len(cons) == 1 and cons[0][0].op == op:
        return cons[0]
    return None


def _is_half_x(t: gs.Tensor, x_root: gs.Tensor) -> bool:
    p = producer(through_qdq(t))
    if p is None or p.op not in ("Mul", "Div"):
        return False
    other, c = _split_const(p)
    half = _near(c, 0.5) if p.op == "Mul" else _near(c, 2.0)
    return half and other is not None and through_qdq(other) is x_root


def _match_product(one_plus: gs.Tensor, x_root: gs.Tensor) -> gs.Tensor | None:
    """The output of ``0.5 * x * one_plus`` in any association, or None."""
    m1 = _single_consumer(one_plus, "Mul")
    if m1 is None:
        return None
    node, read = m1
    other = node.inputs[1] if node.inputs[0] is read else node.inputs[0]
    if _is_half_x(other, x_root):
        return node.outputs[0]
    c = scalar_const(other)
    if c is not None and not _near(c, 0.5) or c is None and through_qdq(other) is not x_root:
        return None
    m2 = _single_consumer(node.outputs[0], "Mul") or _single_consumer(node.outputs[0], "Div")
    if m2 is None:
        return None
    node2, read2 = m2
    other2 = node2.inputs[1] if node2.inputs[0] is read2 else node2.inputs[0]
    if c is None:  # x * (1+erf) then * 0.5 (or / 2)
        want = 0.5 if node2.op == "Mul" else 2.0
        return node2.outputs[0] if _near(scalar_const(other2), want) else None
    return node2.outputs[0] if node2.op == "Mul" and through_qdq(other2) is x_root else None


def _one_plus(t: gs.Tensor) -> gs.Tensor | None:
    add = _single_consumer(t, "Add")
    if add is None:
        return None
    _, c = _split_const(add[0])
    return add[0].outputs[0] if _near(c, 1.0) else None


def _match_erf(erf: gs.Node):
    p = producer(through_qdq(erf.inputs[0]))
    if p is None or p.op not in ("Div", "Mul"):
        return None
    x, c = _split_const(p)
    if x is None or not (_near(c, 2**0.5) if p.op == "Div" else _near(c, 2**-0.5)):
        return None
    one_plus = _one_plus(erf.outputs[0])
    out = _match_product(one_plus, through_qdq(x)) if one_plus is not None else None
    return (x, out, "none") if out is not None else None


def _match_tanh(tanh: gs.Node):
    p = producer(through_qdq(tanh.inputs[0]))
    if p is None or p.op != "Mul":
        return None
    inner, c = _split_const(p)
    if inner is None or not _near(c, (2 / 3.141592653589793) ** 0.5):
        return None
    add = producer(through_qdq(inner))
    if add is None or add.op != "Add":
        return None
    for x, cube in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        cp = producer(through_qdq(cube))
        if cp is not None and cp.op == "Mul" and _near(_split_const(cp)[1], 0.044715):
            one_plus = _one_plus(tanh.outputs[0])
            out = _match_product(one_plus, through_qdq(x)) if one_plus is not None else None
            if out is not None:
                return x, out, "tanh"
    return None


class FuseGelu(Pass):
    name = "fuse_gelu"
    guarantees = ("gelu_fused",)

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        matches = []
        for node in g.nodes:
            m = _match_erf(node) if node.op == "Erf" else _match_tanh(node) if node.op == "Tanh" else None
            if m is not None:
                matches.append(m)
        for x, out, form in matches:
            producer(out).outputs.clear()
            g.nodes.append(
                gs.Node(
                    "Gelu", name=f"{out.name}_gelu", attrs={"approximate": form}, inputs=[x], outputs=[out]
                )
            )
            ctx.count(self.name, f"GELU ({'erf' if form == 'none' else 'tanh'} form)")
        if matches:
            g.cleanup().toposort()
        return bool(matches)
