"""expand_norms: GroupNormalization and InstanceNormalization as a LayerNorm over each group's row.

A group of ``C/G`` channels times the spatial positions is one row: ``Reshape(x, [N, G, -1])``, a
``LayerNormalization`` over it without affine (ILayerNorm then normalizes it in integers, the same row
kernel), ``Reshape`` back, and the per-channel ``scale``/``bias`` as a ``Mul``/``Add`` by constants that the
product and bias rules lower (InstanceNormalization is the case ``G = C``). The statistics are the ones
the normalizations define (biased variance over the group, ``epsilon`` inside the square root); the row
length must be known (static channel and spatial sizes: ``--shape``), or ILayerNorm declines naming the node.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ivit_onnx.graph import const_array, constant, node_label
from ivit_onnx.pipeline import Context, Pass


def _row_length(x: gs.Tensor, groups: int) -> int | str:
    """``C/G * prod(spatial)`` where the shape states them, else a symbol (the LayerNorm then declines)."""
    dims = list(x.shape or [])
    rest = dims[1:]
    if len(rest) < 1 or not all(isinstance(d, int) for d in rest) or rest[0] % groups:
        return "row"
    return int(np.prod(rest)) // groups


class ExpandNorms(Pass):
    name = "expand_norms"
    #: the operators this pass rewrites into ones with rules (the operator table reads it)
    ops = ("GroupNormalization", "InstanceNormalization")

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        changed = False
        for node in [n for n in g.nodes if n.op in self.ops]:
            changed |= self._expand(ctx, node)
        if changed:
            g.cleanup().toposort()
        return changed

    def _expand(self, ctx: Context, node: gs.Node) -> bool:
        x, out = node.inputs[0], node.outputs[0]
        scale, bias = (const_array(t) for t in node.inputs[1:3])
        channels = x.shape[1] if x.shape and len(x.shape) > 2 and isinstance(x.shape[1], int) else None
        if scale is None or bias is None or channels is None:
            why = "its scale and bias are not constants" if channels else "the channel count is unknown"
            ctx.notes.setdefault("declined", {})[node_label(node)] = f"{self.name}: {why}"
            return False
        groups = int(node.attrs.get("num_groups", channels)) if node.op == "GroupNormalization" else channels
        # a scale and bias per channel (opset 21; opset 18's per-group form is deprecated in onnx)
        scale, bias = (np.broadcast_to(v.reshape(-1).astype(np.float32), (channels,)) for v in (scale, bias))
        name, rank = node.name or out.name, len(x.shape)
        length = _row_length(x, groups)
        rows = gs.Variable(f"{name}/rows", dtype=x.dtype, shape=[x.shape[0], groups, length])
        normed = gs.Variable(f"{name}/normalized", dtype=x.dtype, shape=rows.shape)
        back = gs.Variable(f"{name}/unrows", dtype=x.dtype, shape=x.shape)
        scaled = gs.Variable(f"{name}/scaled", dtype=x.dtype, shape=x.shape)
        k = [1, channels] + [1] * (rank - 2)
        c = lambda key, v: constant(f"{name}/{key}", v)  # noqa: E731
        new = [
            gs.Node("Reshape", f"{name}/to_rows", {}, [x, c("rows_shape", np.array([0, groups, -1]))],
                    [rows]),
            gs.Node(
                "LayerNormalization",
                f"{name}/layernorm",
                {"axis": -1, "epsilon": float(node.attrs.get("epsilon", 1e-5))},
                [rows, c("ones", np.ones(length if isinstance(length, int) else 1, np.float32))],
                [normed],
            ),
            gs.Node("Reshape", f"{name}/from_rows", {}, [normed, gs.Variable.empty()], [back]),
            gs.Node("Mul", f"{name}/scale", {}, [back, c("gamma", scale.reshape(k))], [scaled]),
            gs.Node("Add", f"{name}/bias", {}, [scaled, c("beta", bias.reshape(k))], [out]),
        ]
        if all(isinstance(d, int) for d in x.shape):
            new[2].inputs[1] = c("shape", np.array(x.shape, np.int64))
        else:  # a symbolic batch: the shape at run time (the Shape rule reads the integer tensor)
            shape = gs.Variable(f"{name}/shape", dtype=np.int64, shape=[rank])
            new[2].inputs[1] = shape
            new.insert(0, gs.Node("Shape", f"{name}/input_shape", {}, [x], [shape]))
        node.outputs.clear()
        ctx.graph.nodes.extend(new)
        ctx.count(self.name, f"{node.op} as LayerNorm rows")
        return True
