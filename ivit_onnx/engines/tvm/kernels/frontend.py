"""Converters for the ``ai.ivit`` ops in TVM's relax ONNX frontend, and the pass that schedules row kernels.

TVM 0.27's ``from_onnx`` has no custom-converter argument: it looks every node up by ``op_type`` in the
table returned by the private module function ``tvm.relax.frontend.onnx.onnx_frontend._get_convert_map``
(called afresh for the unsupported-op check and for each node). :func:`ivit_converters` wraps that
function for the duration of one import, adding one converter per private op; each converter emits a
``call_tir`` of the op's TE kernel (``BlockBuilder.emit_te``). The op names do not collide with standard
ONNX ops, so the frontend's domain-blindness is harmless here. Elementwise ops stay fusable; row ops are
marked opaque (:data:`.rows.KERNEL_ATTR`) and scheduled by :func:`schedule_row_kernels` after fusion.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ivit_onnx.opset import OPS

from ..relax_expr import const_value, int32_sum
from ..relax_expr import dtype as _dtype
from . import arith, elementwise, layout, poly_softmax, rows

#: relay's OpPatternKind: FuseOps never fuses kOpaque; a GEMM (kOutEWiseFusable) takes consumers up to
#: kBroadcast, but FuseOps refuses a kBroadcast whose argument (the table) does not broadcast: kElemWise
OPAQUE, ELEMWISE = 8, 0
#: attribute of kernels that are injective although they gather from a constant table (ShiftGELU's sigmoid):
#: ``AnnotateTIROpPattern`` calls any data-dependent load opaque, :func:`restore_injective` undoes that
INJECTIVE_ATTR = "ivit.injective"
_INT_ATTRS = {op: tuple(spec.attributes) for op, spec in OPS.items()}
#: the row kernels (:mod:`.rows`, :mod:`.poly_softmax`) by op type
ROW_KERNELS = {"Shiftmax": rows.shiftmax, "ILayerNorm": rows.ilayernorm, "L1LayerNorm": rows.l1layernorm,
               **poly_softmax.KERNELS, "IL2Norm": rows.il2norm}
#: the softmaxes whose kernels also write their output's row sums for P·V (:meth:`_Import.matmul`)
ROW_SUM_OPS = ("Shiftmax", *poly_softmax.KERNELS)


def _static_last_dim(expr, op: str) -> int:
    shape = expr.ty.shape
    if shape is None or not isinstance(shape[-1], tvm.tirx.IntImm):
        raise ValueError(f"{op}: the TVM kernel needs a static last axis, got {shape}")
    return int(shape[-1])


def _attrs(op: str, attr: dict) -> dict:
    return {k: int(attr[k]) for k in _INT_ATTRS[op]}


def _check(op: str, inputs: list, attrs: dict) -> None:
    """Dtypes and attributes as the opset declares them (``OpSpec.check``: one ``ValueError`` line)."""
    OPS[op].check([np.dtype(_dtype(i)) for i in inputs], attrs, where=f"TVM kernel for {op}")


def _check_static(op: str, node: str, inputs: list) -> None:
    """The kernels are TE computes over static shapes: name the node and the operand relax left without one
    (``compile_model`` folds shape arithmetic at the build's input shapes; what is left depends on data)."""
    for k, expr in enumerate(inputs):
        if expr is not None and not isinstance(getattr(expr.ty, "shape", None), relax.ShapeExpr):
            raise ValueError(f"{op} {node!r}: input {k} has no static shape in relax ({expr.ty}); the TVM "
                             f"engine needs every shape fixed at compile time: give each input's --shape, "
                             f"and make the shapes in the graph depend only on them")


@dataclass
class _Emitted:
    """A private op this import turned into a kernel call: its ONNX inputs (Relax exprs) and attributes."""

    op: str
    inputs: list
    attrs: dict


class _Import:
    """The converters' state during one ``from_onnx``: which output var came from which private op, so a
    consumer can take its producer into its own kernel (the frontend converts nodes in topological order).

    - ``Shiftmax(Requantize(x))``: the Requantize (Q·Kᵀ's int8 scores widened to int32) is computed inside
      the row kernel, so the GEMM before it stores int8 and nothing writes int32 to global memory;
    - ``MatMulInteger(Shiftmax(..) uint8, V)`` (or IBertSoftmax, LogIntSoftmax): a uint8 x uint8 GEMM whose
      zero-point term needs the row sums of the probabilities, which the row kernel writes too
      (:meth:`matmul`);
    - ``Transpose(0,2,1)`` ending the patch embedding's layout round trip: :mod:`.layout`.
    """

    def __init__(self, mixed_sign: bool = False):
        self.emitted: dict = {}
        self.mixed_sign = mixed_sign  # uint8 x int8 GEMMs are native (llvm): P·V keeps V int8

    def origin(self, expr) -> _Emitted | None:
        return self.emitted.get(expr) if isinstance(expr, relax.Var) else None

    def convert(self, op: str, bb: relax.BlockBuilder, inputs: list, attr: dict):
        """The converter of private op ``op`` (``attr``: the ONNX node's attributes)."""
        _check_static(op, attr.get("tvm_custom", {}).get("name", "?"), inputs)
        return self.emit(op, bb, list(inputs), _attrs(op, attr))

    def emit(self, op: str, bb: relax.BlockBuilder, inputs: list, attrs: dict):
        """Check, emit and record a call of ``op``'s kernel (``attrs``: its integer attributes)."""
        _check(op, inputs, attrs)
        out = self._emit(op, bb, inputs, attrs)
        self.emitted[out] = _Emitted(op, inputs, attrs)
        return out

    def _emit(self, op: str, bb: relax.BlockBuilder, inputs: list, attrs: dict, row_sum: bool = False):
        name = f"ivit_{op.lower()}"
        extra = {"row_sum": True} if row_sum else {}  # the softmaxes only: see :meth:`matmul`
        if op == "Requantize":
            return bb.emit_te(elementwise.requantize, *inputs, **attrs, primfunc_name_hint=name)
        if op == "IAdd":
            return bb.emit_te(elementwise.iadd, *inputs, **attrs, primfunc_name_hint=name)
        if op == "ShiftGELU":
            return _emit_shiftgelu(bb, inputs, attrs, name)
        if op == "IBertGELU":
            return bb.emit_te(elementwise.ibert_gelu, *inputs, **attrs, primfunc_name_hint=name)
        _static_last_dim(inputs[0], op)
        row_attrs = {rows.KERNEL_ATTR: op, "op_pattern": OPAQUE}
        if op == "Shiftmax" and arith.exp_dtype(attrs["x0"], attrs["n"]) == arith.I32:  # x0 as data
            inputs = [*inputs, relax.const(arith.exp_constants(attrs["x0"], attrs["n"]), "int64")]
        src = self.origin(inputs[0])
        if op == "Shiftmax" and src is not None and src.op == "Requantize":
            kernel, head, hint = rows.shiftmax_requantized, src.inputs, f"ivit_requantize_{name}"
            rq = {f"rq_{k}": v for k, v in src.attrs.items()}
            masked = layout.masked_scores(bb, src.inputs[0])
            if masked is not None:  # the int32 scores come from Where(mask, fill, int32(s))
                *tensors, rq["mask_value"] = masked
                kernel, head = rows.shiftmax_masked, [*tensors, *src.inputs[1:]]
                hint = f"ivit_masked_requantize_{name}"
            return bb.emit_te(
                kernel,
                *head,
                *inputs[1:],
                **rq,
                **attrs,
                **extra,
                primfunc_name_hint=hint,
                primfunc_attrs=row_attrs,
            )
        kernel = ROW_KERNELS[op]
        return bb.emit_te(
            kernel, *inputs, **attrs, **extra, primfunc_name_hint=name, primfunc_attrs=row_attrs
        )

    def matmul(self, bb: relax.BlockBuilder, inputs: list):
        """MatMulInteger ``P·V`` with A a uint8 softmax output (:data:`ROW_SUM_OPS`; scalar zero point ``za``)
        as a uint8 x uint8 GEMM, V shifted by +128 if int8 (its zero point ``zv`` with it; not with
        ``mixed_sign``, where uint8 x int8 is native): ``P·V' - zv·rowsum(P) [- za·colsum(V') + K·za·zv]``,
        exact mod 2**32. The row sums come from the softmax kernel, so with ``za == 0`` (the rewriter's) no
        other kernel computes a zero-point term. Else None."""
        a, b, za, zb = list(inputs) + [None] * (4 - len(inputs))
        src = self.origin(a)
        za_value = np.zeros((), np.uint8) if za is None else const_value(za)
        if src is None or src.op not in ROW_SUM_OPS or _dtype(a) != "uint8":
            return None
        if _dtype(b) not in ("int8", "uint8"):
            return None
        if za_value is None or za_value.size != 1:
            return None
        op, i32 = relax.op, (lambda v: relax.const(v, "int32"))
        za_int, zb_value = int(za_value.reshape(())), np.zeros(()) if zb is None else const_value(zb)
        shift = _dtype(b) == "int8" and not self.mixed_sign
        if not shift and not za_int and zb_value is not None and not np.any(zb_value):
            return bb.emit(op.matmul(a, b, out_dtype="int32"))  # no zero-point term (llvm's u8 x s8)
        both = self._emit(src.op, bb, list(src.inputs), src.attrs, row_sum=True)
        p, sums = bb.emit(relax.TupleGetItem(both, 0)), bb.emit(relax.TupleGetItem(both, 1))
        zv = i32(0) if zb is None else op.astype(zb, "int32")
        if shift:
            b = bb.emit(op.astype(op.add(op.astype(b, "int32"), i32(128)), "uint8"))
            zv = op.add(zv, i32(128))
        gemm = bb.emit(op.matmul(p, b, out_dtype="int32"))
        out = op.subtract(gemm, op.multiply(zv, op.expand_dims(sums, -1)))
        if za_int:
            colsum = int32_sum(b, -2)
            k = int(a.ty.shape[-1])
            out = op.add(op.subtract(out, op.multiply(i32(za_int), colsum)), op.multiply(i32(k * za_int), zv))
        return bb.emit(out)


def _emit_shiftgelu(bb: relax.BlockBuilder, inputs: list, attrs: dict, name: str):
    span = elementwise.gelu_table_range(_dtype(inputs[0]), attrs["x0"], attrs["n"])
    if span is None:
        return bb.emit_te(elementwise.shiftgelu, *inputs, **attrs, primfunc_name_hint=name)
    table = relax.const(elementwise.gelu_table(*span, attrs["x0"], attrs["n"], attrs["bits"]))
    return bb.emit_te(
        elementwise.shiftgelu,
        *inputs,
        table,
        relax.const(span[0], "int64"),
        **attrs,
        primfunc_name_hint=name,
        primfunc_attrs={INJECTIVE_ATTR: 1},
    )


def _converter_classes(state: _Import) -> dict:
    """Converter classes: one per private op; MatMulInteger and Transpose through :class:`_Import`, Gather
    of a constant scalar index and Split as slices (:func:`.layout.gather_as_slice`, ``split_as_slices``)."""
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    def private(op):
        def _impl_v1(cls, bb, inputs, attr, params):
            return state.convert(op, bb, inputs, attr)

        return type(f"Ivit{op}", (fe.OnnxOpConverter,), {"_impl_v1": classmethod(_impl_v1)})

    def _impl_v10(cls, bb, inputs, attr, params):
        out = state.matmul(bb, inputs)
        return out if out is not None else fe.MatMulInteger._impl_v10(bb, inputs, attr, params)

    def _impl_v13(cls, bb, inputs, attr, params):
        if list(attr.get("perm", ())) == [0, 2, 1]:
            out = layout.undo_round_trip(state, bb, inputs[0])
            if out is not None:
                return out
        return fe.Transpose._impl_v13(bb, inputs, attr, params)

    def _impl_gather(cls, bb, inputs, attr, params):
        out = layout.gather_as_slice(bb, inputs, attr)
        return out if out is not None else fe.Gather._impl_v13(bb, inputs, attr, params)

    def _split(version):
        def impl(cls, bb, inputs, attr, params):
            split = getattr(fe.Split, version)(bb, inputs, attr, params)
            slices = layout.split_as_slices(bb, split)
            return split if slices is None else slices

        return classmethod(impl)

    table = {op: private(op) for op in OPS}
    table["Split"] = type("IvitSplit", (fe.Split,), {v: _split(v) for v in ("_impl_v1", "_impl_v13")})
    table["Gather"] = type("IvitGather", (fe.Gather,), {"_impl_v13": classmethod(_impl_gather)})
    table["MatMulInteger"] = type(
        "IvitMatMulInteger", (fe.MatMulInteger,), {"_impl_v10": classmethod(_impl_v10)}
    )
    table["Transpose"] = type("IvitTranspose", (fe.Transpose,), {"_impl_v13": classmethod(_impl_v13)})
    return table


@contextlib.contextmanager
def ivit_converters(mixed_sign: bool = False):
    """Within this block, ``from_onnx`` converts the private ops of ``KERNEL_OPS`` to the kernels of this
    package, MatMulInteger and Transpose through
    :class:`_Import` (``mixed_sign``: see there; the frontend's table is restored on exit)."""
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    original = fe._get_convert_map
    extra = _converter_classes(_Import(mixed_sign))

    def patched():
        table = original()
        table.update(extra)
        return table

    fe._get_convert_map = patched
    try:
        yield
    finally:
        fe._get_convert_map = original


@tvm.transform.module_pass(opt_level=0, name="IvitRestoreInjective")
def restore_injective(mod: tvm.IRModule, _ctx=None) -> tvm.IRModule:
    """After ``AnnotateTIROpPattern``: the table kernels (:data:`INJECTIVE_ATTR`: elementwise in ``x``, the
    table a constant) are marked kElemWise, so ``FuseOps`` folds them into the producing GEMM's epilogue."""
    updates = {
        gv: func.with_attr("op_pattern", ELEMWISE)
        for gv, func in mod.functions_items()
        if isinstance(func, tvm.tirx.PrimFunc) and INJECTIVE_ATTR in (func.attrs or {})
    }
    for gv, func in updates.items():
        mod[gv] = func
    return mod


def schedule_row_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Schedule every row kernel (:data:`.rows.KERNEL_ATTR`) of ``mod`` for ``target``; others untouched."""
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and rows.KERNEL_ATTR in func.attrs:
            if not func.attrs.get("tirx.is_scheduled", False):
                updates[gv] = rows.schedule(func, target)
    for gv, func in updates.items():
        mod[gv] = func
    return mod


__all__ = ["ivit_converters", "restore_injective", "schedule_row_kernels"]
