"""attach_functions: give the model the private ops' function bodies and import the private domain.

So the output runs in stock onnxruntime and ``onnx.reference`` with no extra library.
"""

from __future__ import annotations

from ivit_onnx.opset import DOMAIN, VERSION
from ivit_onnx.opset.functions import with_bodies
from ivit_onnx.pipeline import Context, Pass


class AttachFunctions(Pass):
    name = "attach_functions"
    requires = ("integer_only",)
    guarantees = ("functions_attached",)

    def run(self, ctx: Context) -> bool:
        used = sorted({n.op for n in ctx.graph.nodes if n.domain == DOMAIN})
        ctx.functions = with_bodies(ctx.functions, used, ctx.opset)
        if used:
            ctx.opset_imports[DOMAIN] = VERSION
        ctx.count(self.name, "functions", len(used))
        return bool(used)
