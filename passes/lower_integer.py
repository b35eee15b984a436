"""lower_integer: replace every float op between the input quantize and the output dequantize by integer ops.

Walks the graph once in topological order with the lowering rules (``rules.RULES``), carrying an affine
type on each lowered tensor. A node no rule lowers (none for its op, or its rule declined, with a reason)
is a float island: strict mode stops naming each with its reason; ``allow_float`` keeps them, fed by
DequantizeLinear, and reports them.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.errors import ConversionError, one_line
from ivit_onnx.graph import detach, node_label
from ivit_onnx.pipeline import Context, Pass

from .fuse_gelu import unfuse
from .pattern import match
from .rules import RULES, Lowerer, Outcome, token_mask
from .rules.lowerer import macs


def _is_float(t: gs.Tensor) -> bool:
    dt = t.values.dtype if isinstance(t, gs.Constant) else t.dtype
    return dt is not None and np.dtype(dt).kind == "f"


def _lower(lw: Lowerer, node: gs.Node) -> Outcome | str:
    """The rule's outcome, or the reason no rule lowers ``node``."""
    rule = RULES.get(node.op)
    m = match(rule.pattern, node) if rule is not None else None
    if m is None:
        return f"no integer rule for {node.op}"
    try:
        return rule.check(lw, m) or rule.rewrite(lw, m)
    except ValueError as e:
        if not lw.opt.allow_float:
            raise ConversionError(f"{node_label(node)}: {e}") from None
        return one_line(e)


def _shape_hint(g: gs.Graph, nodes: list[gs.Node]) -> str:
    """Advice when an island is computed from the shape of an input with symbolic dimensions (Hugging Face's
    masks and views): fixing the shapes lets ``fold_constants`` turn that subgraph into constants."""
    shown = {t.name: [str(d) if isinstance(d, int) else "?" for d in t.shape or []] for t in g.inputs}
    symbolic = {k: v for k, v in shown.items() if "?" in v}
    if not symbolic or not any(_reads_a_shape(n) for n in nodes):
        return ""
    dims = ", ".join(f"{k}: [{','.join(v)}]" for k, v in symbolic.items())
    return f"they depend on symbolic input shapes ({dims}): fix them with --shape NAME=D0,D1,... or "


def _reads_a_shape(node: gs.Node, limit: int = 64) -> bool:
    """A ``Shape`` node is among the first ``limit`` ancestors of ``node``."""
    todo, seen = [node], set()
    while todo and len(seen) < limit:
        n = todo.pop()
        if n.op == "Shape":
            return True
        seen.add(id(n))
        todo += [t.inputs[0] for t in n.inputs if t.inputs and id(t.inputs[0]) not in seen]
    return False


class LowerInteger(Pass):
    name = "lower_integer"
    requires = ("constant_qdq_params",)
    guarantees = ("integer_only",)

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        g.toposort()
        lw = Lowerer(ctx)
        islands: dict[str, str] = {}  # label -> the reason it stays float
        island_nodes: list[gs.Node] = []
        float_macs, gelus = 0, []
        for node in list(g.nodes):
            lw.node_hint = ctx.where = node.name or node.op
            outcome = _lower(lw, node)
            if outcome is Outcome.HANDLED:
                detach(node)
                continue
            if isinstance(outcome, str) and (
                any(_is_float(t) for t in node.outputs)
                or any(lw.get(t) is not None or token_mask.lookup(lw, t) is not None for t in node.inputs)
            ):
                islands[node_label(node)] = outcome
                island_nodes.append(node)
                float_macs += macs(node) if node.op in ("MatMul", "Gemm", "Conv") else 0
                gelus += [node] if node.op == "Gelu" and ctx.opset < 20 else []
            for i, t in enumerate(node.inputs):
                if lw.get(t) is not None:
                    node.inputs[i] = lw.materialize(t)
        self._bind_outputs(lw)
        for node in gelus:
            unfuse(g, node)
        fused = ctx.notes.get("declined", {})  # a fusion's reason explains the island it leaves
        reasons = {k: v + (f" ({fused[k]})" if k in fused else "") for k, v in islands.items()}
        if islands and not ctx.options.allow_float:
            names = "; ".join(f"{k}: {v}" for k, v in list(reasons.items())[:8]) + " ..." * (len(islands) > 8)
            raise ConversionError(
                f"{len(islands)} node(s) have no integer rule that applies (float islands): {names}; "
                f"{_shape_hint(g, island_nodes)}rerun with --allow-float to keep them as DQ → float → Q"
            )
        ctx.notes["float_islands"] = list(islands)
        ctx.notes["float_island_reasons"] = reasons
        integer = ctx.notes.get("integer_macs", 0)
        ctx.notes["total_macs"] = total = integer + float_macs
        ctx.notes["integer_mac_percent"] = 100.0 * integer / total if total else 100.0
        ctx.notes["max_dyadic_rel_error"] = lw.max_dyadic_error
        table = lw.tensor_map()
        ctx.metadata["ivit_onnx.tensor_map"] = json.dumps(table, sort_keys=True)
        if ctx.options.scale_table:
            ctx.notes["scales"] = table
        g.cleanup().toposort()
        return True

    @staticmethod
    def _bind_outputs(lw: Lowerer) -> None:
        for t in lw.g.outputs:
            if lw.get(t) is not None:
                lw.materialize(t, out=t)
            elif t.name in lw.alias:
                lw.g.nodes.append(
                    gs.Node("Identity", name=lw.fresh("output"), inputs=[lw.alias[t.name][0]], outputs=[t])
                )
