"""Per-op lowering rules of ``lower_integer``: one explicit table, op_type → rule (nothing self-registers)."""

from __future__ import annotations

from . import elementwise, layout, linear, nonlinear, qdq
from .lowerer import Lowerer, Outcome

RULES = {
    "QuantizeLinear": qdq.quantize,
    "DequantizeLinear": qdq.dequantize,
    "Clip": qdq.clip,
    "MatMul": linear.matmul,
    "Gemm": linear.gemm,
    "Conv": linear.conv,
    "Add": elementwise.add,
    "Mul": elementwise.scale_by_const,
    "Div": elementwise.scale_by_const,
    "Softmax": nonlinear.softmax,
    "Gelu": nonlinear.gelu,
    "LayerNormalization": nonlinear.layernorm,
    "Concat": layout.concat,
    "Shape": layout.shape,
    "Cast": layout.cast,
    **{op: layout.pass_through for op in layout.PASS_THROUGH},
}

__all__ = ["RULES", "Lowerer", "Outcome"]
