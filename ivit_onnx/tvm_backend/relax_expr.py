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


__all__ = ["const_value", "dtype", "is_call"]
