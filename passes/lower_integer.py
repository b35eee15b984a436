"""lower_integer: replace every float op between the input quantize and the output dequantize by integer ops.

Walks the graph once in topological order with the lowering rules (``rules.RULES``), carrying an affine
type on each lowered tensor. A node no rule lowers (none for its op, or its rule declined, with a reason)
is a float island: strict mode stops naming each with its reason; ``allow_float`` keeps them, fed by
DequantizeLinear, and reports them.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.errors import ConversionError, one_line
from ivit_onnx.graph import detach, node_label
from ivit_onnx.pipeline import Context, Pass

from .fuse_gelu import unfuse
from .pattern import match
from .rules import RULES, Lowerer, Outcome, token_mask
from .rules.lowerer import MAC_OPS, macs


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


#: the words of a rule's decline when it needs a dimension the graph does not state ("the channel count is
#: unknown"): static input shapes may give it one
UNKNOWN_DIMENSION = "unknown"


def _shape_hint(g: gs.Graph, nodes: list[gs.Node], reasons: list[str]) -> str:
    """Advice when fixing the input shapes would remove islands: those computed from the shapes of inputs
    with symbolic dimensions alone (Hugging Face's masks and views), which ``fold_constants`` then turns into
    constants, and those whose rule declined for an unknown dimension. Islands that read data for any other
    reason (a float op on activations) get no such advice: fixing shapes would not remove them."""
    shown = {t.name: [str(d) if isinstance(d, int) else "?" for d in t.shape or []] for t in g.inputs}
    symbolic = {k: v for k, v in shown.items() if "?" in v}
    if not symbolic:
        return ""
    memo: dict[str, bool | None] = {}
    fixable = [n for n, why in zip(nodes, reasons, strict=True)
               if UNKNOWN_DIMENSION in why or _from_shapes(n, memo)]
    if not fixable:
        return ""
    dims = ", ".join(f"{k}: [{','.join(v)}]" for k, v in symbolic.items())
    return (
        f"{len(fixable)} of them depend on symbolic input shapes ({dims}): fix those with "
        "--shape NAME=D0,D1,...; "
    )


def _from_shapes(node: gs.Node, memo: dict[str, bool | None]) -> bool:
    """``node`` computes from constants and ``Shape`` outputs alone, with at least one ``Shape`` among them
    (so static input shapes make it a constant); no graph input or activation reaches it otherwise."""
    found = False
    for t in node.inputs:
        got = _tensor_from_shapes(t, memo)
        if got is None:
            return False
        found |= got
    return found


def _tensor_from_shapes(t: gs.Tensor, memo: dict[str, bool | None]) -> bool | None:
    """For :func:`_from_shapes`: None when ``t`` depends on data, else whether a ``Shape`` is among its
    sources. Iterative (no recursion limit on long chains), memoized per tensor."""
    todo = [t]
    while todo:
        cur = todo[-1]
        if cur.name in memo:
            todo.pop()
            continue
        if isinstance(cur, gs.Constant) or not cur.name:
            memo[cur.name] = False
            todo.pop()
            continue
        if not cur.inputs:  # a graph input read as data
            memo[cur.name] = None
            todo.pop()
            continue
        producer = cur.inputs[0]
        if producer.op in ("Shape", "Size"):
            memo[cur.name] = True
            todo.pop()
            continue
        pending = [i for i in producer.inputs if i.name not in memo]
        if pending:
            todo += pending
            continue
        results = [memo[i.name] for i in producer.inputs]
        memo[cur.name] = None if any(r is None for r in results) else any(results)
        todo.pop()
    return memo[t.name]


def _island_message(reasons: dict[str, str], nodes: list[gs.Node], hint: str, shown: int = 4) -> str:
    """Strict mode's one line: every island counted by op (most first), the first few with their reasons."""
    by_op = Counter(n.op for n in nodes).most_common()
    groups = ", ".join(f"{op} ×{k}" for op, k in by_op)
    first = "; ".join(f"{k}: {v}" for k, v in list(reasons.items())[:shown])
    more = f"; ... ({len(reasons) - shown} more)" if len(reasons) > shown else ""
    return (
        f"{len(reasons)} node(s) have no integer rule that applies (float islands: {groups}): {first}{more}; "
        f"{hint}rerun with --allow-float to keep them as DQ → float → Q (the report lists every island)"
    )


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
                float_macs += macs(node) if node.op in MAC_OPS else 0
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
            hint = _shape_hint(g, island_nodes, [reasons[node_label(n)] for n in island_nodes])
            raise ConversionError(_island_message(reasons, island_nodes, hint))
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
