"""finalize: deterministic names and order, IR version onnxruntime 1.31 reads, and a full onnx check.

Same input, same options → byte-identical output (names come from the source graph and counters,
never from ids or hashes).
"""

from __future__ import annotations

import onnx

from ivit_onnx.errors import ConversionError, one_line
from ivit_onnx.io import MAX_IR_VERSION, skeleton
from ivit_onnx.pipeline import Context, Pass


class Finalize(Pass):
    name = "finalize"
    guarantees = ("checked",)

    def run(self, ctx: Context) -> bool:
        g = ctx.graph
        g.cleanup(remove_unused_graph_inputs=False).toposort()
        for i, node in enumerate(g.nodes):
            if not node.name:
                node.name = f"{node.op}_{i}"
        ctx.ir_version = min(max(ctx.ir_version, 8), MAX_IR_VERSION)
        return False


def check(model: onnx.ModelProto) -> None:
    """Full onnx check (with shape inference through the function bodies); one-line error."""
    try:  # on the weight-free skeleton: the same check, without copies of the weights
        onnx.checker.check_model(skeleton(model), full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError, and the checker's C++ errors
        raise ConversionError(f"output fails the ONNX check: {one_line(e)}") from None
