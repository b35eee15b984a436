"""lower_integer: replace every float op between the input quantize and the output dequantize by integer ops.

Walks the graph once in topological order with a table of per-op rules (``rules.RULES``), carrying an
affine type on each lowered tensor. A node without a rule is a float island: strict mode stops with the
list of such nodes; ``allow_float`` keeps them, fed by DequantizeLinear and reported.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.errors import ConversionError
from ivit_onnx.graph import detach, node_label
from ivit_onnx.pipeline import Context, Pass

from .rules import RULES, Lowerer, Outcome
from .rules.linear import count_macs


def _is_float(t: gs.Tensor) -> bool:
    dt = t.values.dtype if isinstance(t, gs.Constant) else t.dtype
    return dt is not None and np.dtype(dt).kind == "f"


def _macs(node: gs.Node) -> int:
    """MACs of a MatMul/Gemm/Conv left in float (the integer rules count theirs with the same helper)."""
    w = node.inputs[1].shape or []
    if node.op == "Conv":
        k = int(np.prod(w[1:]))
    elif node.op == "Gemm":
        k = w[1 if node.attrs.get("transB", 0) else 0] if len(w) == 2 else 1
    else:
        k = w[-2] if len(w) >= 2 else 1
    return count_macs(node.outputs[0].shape, k if isinstance(k, int) else 1)


def _expand_gelu(g: gs.Graph, node: gs.Node) -> None:
    """A Gelu marker left as a float island in a pre-opset-20 model goes back to standard ops."""
    x, out = node.inputs[0], node.outputs[0]
    detach(node)
    c = lambda v, n: gs.Constant(f"{out.name}/{n}", np.array(v, np.float32))  # noqa: E731
    if node.attrs.get("approximate", "none") == "tanh":
        x3 = g.layer(
            op="Mul",
            inputs=[x, g.layer(op="Mul", inputs=[x, x], outputs=[f"{out.name}/x2"])[0]],
            outputs=[f"{out.name}/x3"],
        )[0]
        inner = g.layer(
            op="Add",
            inputs=[x, g.layer(op="Mul", inputs=[x3, c(0.044715, "k")], outputs=[f"{out.name}/kx3"])[0]],
            outputs=[f"{out.name}/in"],
        )[0]
        arg = g.layer(
            op="Mul", inputs=[inner, c(float(np.sqrt(2 / np.pi)), "s")], outputs=[f"{out.name}/arg"]
        )[0]
        t = g.layer(op="Tanh", inputs=[arg], outputs=[f"{out.name}/t"])[0]
    else:
        arg = g.layer(op="Div", inputs=[x, c(float(np.sqrt(2.0)), "s")], outputs=[f"{out.name}/arg"])[0]
        t = g.layer(op="Erf", inputs=[arg], outputs=[f"{out.name}/t"])[0]
    one_plus = g.layer(op="Add", inputs=[t, c(1.0, "one")], outputs=[f"{out.name}/1p"])[0]
    half_x = g.layer(op="Mul", inputs=[x, c(0.5, "half")], outputs=[f"{out.name}/hx"])[0]
    g.layer(op="Mul", inputs=[half_x, one_plus], outputs=[out])


class LowerInteger(Pass):
    name = "lower_integer"
    requires = ("constant_qdq_params",)
    guarantees = ("integer_only",)

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        g.toposort()
        lw = Lowerer(ctx)
        islands: list[gs.Node] = []
        why: dict[int, str] = {}  # island -> the reason its rule gave up (with allow_float)
        float_macs = 0
        for node in list(g.nodes):
            lw.node_hint = ctx.where = node.name or node.op
            rule = RULES.get(node.op)
            try:
                outcome = rule(lw, node) if rule is not None else Outcome.FLOAT
            except ValueError as e:
                if not ctx.options.allow_float:
                    raise ConversionError(f"{node_label(node)}: {e}") from None
                outcome, why[id(node)] = Outcome.FLOAT, str(e).splitlines()[0]  # stays float, reported
            if outcome is Outcome.HANDLED:
                detach(node)
                continue
            if outcome is Outcome.FLOAT and (
                any(_is_float(t) for t in node.outputs) or any(lw.get(t) is not None for t in node.inputs)
            ):
                islands.append(node)
                if node.op in ("MatMul", "Gemm", "Conv"):
                    float_macs += _macs(node)
            for i, t in enumerate(node.inputs):
                if lw.get(t) is not None:
                    node.inputs[i] = lw.materialize(t)
        self._bind_outputs(lw)
        for node in islands:
            if node.op == "Gelu" and ctx.opset < 20:
                _expand_gelu(g, node)
        if islands and not ctx.options.allow_float:
            names = ", ".join(node_label(n) for n in islands[:8]) + (" ..." if len(islands) > 8 else "")
            raise ConversionError(
                f"{len(islands)} node(s) have no integer rule (float islands): {names}; "
                "rerun with --allow-float to keep them as DQ → float → Q"
            )
        ctx.notes["float_islands"] = [
            node_label(n) + (f" ({why[id(n)]})" if id(n) in why else "") for n in islands
        ]
        total = ctx.notes.get("integer_macs", 0) + float_macs
        ctx.notes["total_macs"] = total
        ctx.notes["integer_mac_percent"] = (
            100.0 * ctx.notes.get("integer_macs", 0) / total if total else 100.0
        )
        ctx.notes["max_dyadic_rel_error"] = lw.max_dyadic_error
        table = {
            it.name: {
                "dtype": a.dtype.name,
                "zero_point": a.zero_point,
                "scale": a.scale.tolist(),
                "bound": a.bound,
                "replaces": name,
            }
            for name, (it, a) in sorted(lw.itype.items())
            if not isinstance(it, gs.Constant)
        }
        ctx.metadata["ivit_onnx.tensor_map"] = json.dumps(table, sort_keys=True)
        if ctx.options.scale_table:
            ctx.notes["scales"] = table
        g.cleanup().toposort()
        return True

    @staticmethod
    def _bind_outputs(lw: Lowerer) -> None:
        g = lw.g
        outs = []
        for t in g.outputs:
            if lw.get(t) is not None:
                lw.materialize(t, out=t)
            elif t.name in lw.alias:
                it = lw.alias[t.name][0]
                g.nodes.append(gs.Node("Identity", name=lw.fresh("output"), inputs=[it], outputs=[t]))
            outs.append(t)
        g.outputs = outs
