"""expand_einsum: Einsum in its matmul forms as Transpose / Unsqueeze / MatMul / Squeeze, which have rules.

A two-operand equation that contracts exactly one index, where every other index is a batch index of both
operands or a free index of one (``bhqd,bhkd->bhqk``, ``bhqk,bhkd->bhqd``, ``bnd,dm->bnm``, ``bd,nd->bn``,
``...ij,...jk->...ik``), is one MatMul: each operand is transposed to ``[batch, free, row, k]`` /
``[batch, free, k, column]`` (a missing row or column, or the other operand's extra free indices, as axes of
size 1 that MatMul broadcasts), and the product is squeezed and transposed to the output's order. A
one-operand permutation (``ij->ji``) is a Transpose. The integer GEMM then lowers like any MatMul, exactly.
Other forms (two contracted indices, an index summed in one operand only, a diagonal) stay as they are and
are float islands with that reason.
"""

from __future__ import annotations

import string

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.graph import constant, node_label
from ivit_onnx.pipeline import Context, Pass


def parse(equation: str, ranks: list[int | None]) -> tuple[list[str], str]:
    """The operands' and the output's index strings, an ellipsis spelt out as letters the equation does not
    use (aligned from the right; their count from the ranks); the implicit output is the indices seen once,
    sorted, as ONNX defines it. ValueError where the form is not supported."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"{len(terms)} operand terms for {len(ranks)} inputs")
    unused = [c for c in string.ascii_letters if c not in eq]
    ell = ""
    if "..." in eq:
        counts = set()
        for t, r in zip(terms, ranks, strict=True):
            if "..." in t:
                if r is None:
                    raise ValueError("an ellipsis with an operand of unknown rank")
                counts.add(r - len(t.replace("...", "")))
        if len(counts) != 1:
            raise ValueError("ellipses of different ranks")
        ell = "".join(unused[: counts.pop()])
        terms = [t.replace("...", ell) for t in terms]
        rhs = rhs.replace("...", ell)
    if not arrow:
        once = [c for c in sorted(set("".join(terms))) if "".join(terms).count(c) == 1 and c not in ell]
        rhs = ell + "".join(once)
    for t in (*terms, rhs):
        if len(set(t)) != len(t):
            raise ValueError(f"a repeated index in '{t}' (a diagonal)")
    return terms, rhs


def plan(terms: list[str], out: str) -> dict:
    """The MatMul form of a two-operand equation: each operand's index order (with ``1`` for a unit axis to
    insert), the product's index order, and the unit axes to squeeze. ValueError where there is none."""
    a, b = terms
    contracted = [c for c in a if c in b and c not in out]
    if len(contracted) != 1:
        raise ValueError(f"contracts {len(contracted)} indices (one is a MatMul)")
    alone = [c for c in a + b if c not in out and c not in contracted]
    if alone:
        raise ValueError(f"sums index '{alone[0]}' of one operand only")
    if set(out) - set(a) - set(b):
        raise ValueError("an output index no operand has")
    k = contracted[0]
    batch = [c for c in out if c in a and c in b]
    free_a = [c for c in out if c in a and c not in b]
    free_b = [c for c in out if c in b and c not in a]
    row, col = free_a[-1:], free_b[-1:]
    rest_a, rest_b = free_a[:-1], free_b[:-1]
    if rest_a and rest_b:
        raise ValueError("both operands have several free indices")
    rest = rest_a or rest_b
    # operand orders; "1" is a unit axis MatMul broadcasts (the other operand's extra free indices)
    order_a = batch + (rest_a or ["1"] * len(rest_b)) + (row or ["1"]) + [k]
    order_b = batch + (rest_b or ["1"] * len(rest_a)) + [k] + (col or ["1"])
    product = batch + rest + (row or ["1"]) + (col or ["1"])
    return {"a": order_a, "b": order_b, "product": product}


class ExpandEinsum(Pass):
    name = "expand_einsum"
    #: the operators this pass rewrites into ones with rules (the operator table reads it)
    ops = ("Einsum",)
    ops_how = ("its matmul forms (one contracted index): `passes/expand_einsum.py` makes them Transpose / "
               "MatMul; other forms: an island with the reason")

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        changed = False
        for node in [n for n in g.nodes if n.op == "Einsum"]:
            ranks = [len(x.shape) if x.shape is not None else None for x in node.inputs]
            try:
                terms, out = parse(node.attrs.get("equation", ""), ranks)
                if len(terms) == 1:
                    self._permute(ctx, node, terms[0], out)
                else:
                    self._matmul(ctx, node, terms, out, plan(terms, out))
            except ValueError as e:
                ctx.notes.setdefault("declined", {})[node_label(node)] = f"{self.name}: {e}"
                continue
            changed = True
        if changed:
            g.cleanup().toposort()
        return changed

    def _permute(self, ctx: Context, node: gs.Node, term: str, out: str) -> None:
        if sorted(term) != sorted(out):
            raise ValueError(f"'{term}->{out}' is not a permutation")
        y = node.outputs[0]
        node.outputs.clear()
        perm = [term.index(c) for c in out]
        x = node.inputs[0]
        ctx.graph.nodes.append(gs.Node("Transpose", f"{node.name}/transpose", {"perm": perm}, [x], [y]))
        ctx.count(self.name, "Einsum → Transpose")

    def _matmul(self, ctx: Context, node: gs.Node, terms: list[str], out: str, p: dict) -> None:
        g, name, dtype = ctx.graph, node.name or node.outputs[0].name, node.outputs[0].dtype
        operands = [self._arrange(ctx, f"{name}/{side}", x, term, p[side])
                    for side, x, term in (("a", node.inputs[0], terms[0]), ("b", node.inputs[1], terms[1]))]
        units = [i for i, c in enumerate(p["product"]) if c == "1"]
        kept = [c for c in p["product"] if c != "1"]
        perm = [kept.index(c) for c in out]
        y = node.outputs[0]
        node.outputs.clear()
        steps = [("MatMul", None)] + ([("Squeeze", units)] if units else [])
        steps += [("Transpose", perm)] if perm != list(range(len(perm))) else []
        cur = operands
        for i, (op, arg) in enumerate(steps):
            t = y if i == len(steps) - 1 else gs.Variable(f"{name}/{op.lower()}_out", dtype=dtype)
            if op == "Transpose":
                g.nodes.append(gs.Node(op, f"{name}/transpose", {"perm": arg}, cur, [t]))
            elif op == "Squeeze":
                g.nodes.append(_axes_node(ctx, op, f"{name}/squeeze", cur[0], arg, t))
            else:
                g.nodes.append(gs.Node(op, f"{name}/matmul", {}, cur, [t]))
            cur = [t]
        ctx.count(self.name, "Einsum → MatMul")

    @staticmethod
    def _arrange(ctx: Context, name: str, x: gs.Tensor, term: str, order: list[str]) -> gs.Tensor:
        """``x`` (indices ``term``) transposed to ``order``'s letters, unit axes where ``order`` says 1."""
        letters = [c for c in order if c != "1"]
        perm = [term.index(c) for c in letters]
        if perm != list(range(len(term))):
            t = gs.Variable(f"{name}/transposed", dtype=x.dtype)
            ctx.graph.nodes.append(gs.Node("Transpose", f"{name}/transpose", {"perm": perm}, [x], [t]))
            x = t
        units = [i for i, c in enumerate(order) if c == "1"]
        if units:
            t = gs.Variable(f"{name}/unsqueezed", dtype=x.dtype)
            ctx.graph.nodes.append(_axes_node(ctx, "Unsqueeze", f"{name}/unsqueeze", x, units, t))
            x = t
        return x


def _axes_node(ctx: Context, op: str, name: str, x: gs.Tensor, axes: list[int], y: gs.Tensor) -> gs.Node:
    """Squeeze / Unsqueeze of ``axes``: an input from opset 13, an attribute before."""
    if ctx.opset >= 13:
        return gs.Node(op, name, {}, [x, constant(f"{name}_axes", np.asarray(axes, np.int64))], [y])
    return gs.Node(op, name, {"axes": list(axes)}, [x], [y])
