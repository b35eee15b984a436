"""Small readers of Relax expressions shared by the TVM hand-off's Relax rewrites and frontend converters."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def dtype(expr) -> str:
    """The element type of a tensor-typed Relax expression (e.g. ``"int8"``)."""
    return str(expr.ty.dtype)


def is_call(expr, name: str) -> bool:
    """Whether ``expr`` calls the Relax operator ``name`` (e.g. ``"relax.matmul"``)."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def const_value(expr) -> np.ndarray | None:
    """The value of a Relax constant, else None."""
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def bound(lookup, expr):
    """The value bound to ``expr`` through var-to-var bindings, else ``expr`` itself (``lookup``: the
    ``lookup_binding`` of the BlockBuilder or mutator that emitted them)."""
    while isinstance(expr, relax.Var):
        value = lookup(expr)
        if value is None:
            return expr
        expr = value
    return expr


def static_shape(expr) -> list[int] | None:
    """The shape of a tensor-typed expression when every dimension is static, else None."""
    ty = getattr(expr, "ty", None)
    shape = ty.shape if isinstance(ty, relax.TensorType) else None
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def int32_sum(x, axis: int):
    """``sum(int32(x))`` over ``axis``, kept: the row/column sums of GEMM zero-point terms."""
    return relax.op.sum(relax.op.astype(x, "int32"), axis=[axis], keepdims=True)


__all__ = ["bound", "const_value", "dtype", "int32_sum", "is_call", "static_shape"]
