"""Keep MatMulInteger's operands 8-bit in Relax, so backends can use int8 dot products (tensor cores).

TVM's frontend imports ``MatMulInteger(a, b, za, zb)`` as
``matmul(astype(a, int32) - za, astype(b, int32) - zb)``: int8 weights become int32 constants and every
schedule multiplies int32. This pass rewrites that pattern into ``matmul(a8, b8, out_dtype=int32)`` on
int8 operands (uint8 is shifted by -128 into int8, its zero point with it) plus the zero-point
corrections ``- za*colsum(b8) - zb*rowsum(a8) + K*za*zb`` where a zero point is not known to be 0.
The identity holds modulo 2**32, so the result is bit-identical to the int32 matmul.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_expr import bound, int32_sum
from .relax_expr import dtype as _dtype
from .relax_expr import is_call as _is_call

_FOLDABLE = {
    "relax.astype": lambda x, attrs: x.astype(str(attrs.dtype)),
    "relax.expand_dims": lambda x, attrs: np.expand_dims(x, tuple(int(a) for a in attrs.axis)),
}


@mutator
class _Int8MatmulRewriter(PyExprMutator):
    """Rewrites ``matmul(astype(i8|u8, int32) [- zp], ...)`` calls; counts them in ``self.count``."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.count = 0

    def _bound(self, expr):
        return bound(self.lookup_binding, expr)

    def _const(self, expr) -> np.ndarray | None:
        """numpy value of a constant expression built from constants by astype/expand_dims, else None."""
        expr = self._bound(expr)
        if isinstance(expr, tvm.ir.GenericConst):
            return expr.value.numpy()
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in _FOLDABLE:
            inner = self._const(expr.args[0])
            return None if inner is None else _FOLDABLE[expr.op.name](inner, expr.attrs)
        return None

    def _operand(self, expr, zp_last_axis: int):
        """``(x, zp)`` for ``astype(x, int32) [- zp]`` with 8-bit ``x`` (zp: int32 expr, array or None)."""
        zp = None
        value = self._bound(expr)
        if _is_call(value, "relax.subtract"):
            value, zp = self._bound(value.args[0]), value.args[1]
            shape = zp.ty.shape
            if zp.ty.ndim > 0 and (shape is None or int(shape[zp_last_axis]) != 1):
                return None  # not constant along K: not a MatMulInteger zero point
        if not _is_call(value, "relax.astype") or _dtype(value) != "int32":
            return None
        x = value.args[0]
        if _dtype(x) not in ("int8", "uint8"):
            return None
        if zp is not None:
            const = self._const(zp)
            zp = const.astype(np.int32) if const is not None else zp
        return x, zp

    def _to_int8(self, x, zp):
        """Shift a uint8 operand and its zero point by -128 into int8 (exact: ``x - zp`` is unchanged)."""
        if _dtype(x) == "int8":
            return x, zp
        const = self._const(x)
        if const is not None:
            x8 = relax.const((const.astype(np.int16) - 128).astype(np.int8))
        else:
            wide = self.builder_.emit(relax.op.astype(x, "int32"))
            shifted = relax.op.subtract(wide, relax.const(128, "int32"))
            x8 = self.builder_.emit(relax.op.astype(shifted, "int8"))
        if zp is None:
            zp = np.int32(0)
        if isinstance(zp, np.ndarray) or np.isscalar(zp):
            return x8, (np.asarray(zp, np.int32) - 128).astype(np.int32)
        return x8, self.builder_.emit(relax.op.subtract(zp, relax.const(128, "int32")))

    def _zp_expr(self, zp):
        if zp is None or (not isinstance(zp, relax.Expr) and not np.any(zp)):
            return None
        return relax.const(np.asarray(zp, np.int32)) if not isinstance(zp, relax.Expr) else zp

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not _is_call(call, "relax.matmul") or _dtype(call) != "int32" or len(call.args) != 2:
            return call
        a, b = call.args
        if a.ty.ndim < 2 or b.ty.ndim < 2:
            return call
        lhs, rhs = self._operand(a, -1), self._operand(b, -2)
        if lhs is None or rhs is None:
            return call
        (a8, za), (b8, zb) = self._to_int8(*lhs), self._to_int8(*rhs)
        za, zb = self._zp_expr(za), self._zp_expr(zb)
        emit = self.builder_.emit
        out = emit(relax.op.matmul(a8, b8, out_dtype="int32"))
        if za is not None:
            colsum = emit(int32_sum(b8, -2))
            out = emit(relax.op.subtract(out, relax.op.multiply(za, colsum)))
        if zb is not None:
            rowsum = emit(int32_sum(a8, -1))
            out = emit(relax.op.subtract(out, relax.op.multiply(zb, rowsum)))
        if za is not None and zb is not None:
            k = int(a8.ty.shape[-1])
            kzz = relax.op.multiply(relax.const(k, "int32"), relax.op.multiply(za, zb))
            out = emit(relax.op.add(out, kzz))
        self.count += 1
        return out


def int8_matmul(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """Apply the rewrite to every Relax function of ``mod``; returns the new module and the rewrite count."""
    rewriter = _Int8MatmulRewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    new = rewriter.builder_.get()
    # the rewritten call's old binding is left as ``lv = <new var>``: such aliases stop FuseOps from fusing
    # the GEMM with its epilogue (bias add, Requantize), so fold them away
    new = relax.transform.CanonicalizeBindings()(new)
    return relax.transform.DeadCodeElimination()(new), rewriter.count
