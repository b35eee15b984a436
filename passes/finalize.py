"""finalize: deterministic names and order, and an IR version onnxruntime 1.31 reads.

Same input, same options → byte-identical output (names come from the source graph and counters,
never from ids or hashes). The full onnx check runs on the exported model, in :func:`ivit_onnx.rewrite`.
"""

from __future__ import annotations

from ivit_onnx.io import MAX_IR_VERSION
from ivit_onnx.pipeline import Context, Pass


class Finalize(Pass):
    name = "finalize"
    guarantees = ("named", "sorted")

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        g.cleanup(remove_unused_graph_inputs=False).toposort()
        for i, node in enumerate(g.nodes):
            if not node.name:
                node.name = f"{node.op}_{i}"
        ctx.ir_version = min(max(ctx.ir_version, 8), MAX_IR_VERSION)
        return False
