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

import numpy as np
import tvm
from tvm import relax

from ...opset import OPS
from . import elementwise, rows

#: relay's OpPatternKind: FuseOps never fuses kOpaque; a GEMM (kOutEWiseFusable) takes consumers up to
#: kBroadcast, but FuseOps refuses a kBroadcast whose argument (the table) does not broadcast: kElemWise
OPAQUE, ELEMWISE = 8, 0
#: attribute of kernels that are injective although they gather from a constant table (ShiftGELU's sigmoid):
#: ``AnnotateTIROpPattern`` calls any data-dependent load opaque, :func:`restore_injective` undoes that
INJECTIVE_ATTR = "ivit.injective"
_INT_ATTRS = {op: tuple(spec.attributes) for op, spec in OPS.items()}


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


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


def _convert(op: str, bb: relax.BlockBuilder, inputs: list, attr: dict):
    inputs = list(inputs)
    attrs = _attrs(op, attr)
    _check(op, inputs, attrs)
    name = f"ivit_{op.lower()}"
    if op == "Requantize":
        return bb.emit_te(elementwise.requantize, *inputs, **attrs, primfunc_name_hint=name)
    if op == "IAdd":
        return bb.emit_te(elementwise.iadd, *inputs, **attrs, primfunc_name_hint=name)
    if op == "ShiftGELU":
        span = elementwise.gelu_table_range(_dtype(inputs[0]), attrs["x0"], attrs["n"])
        if span is None:
            return bb.emit_te(elementwise.shiftgelu, *inputs, **attrs, primfunc_name_hint=name)
        table = relax.const(elementwise.gelu_table(*span, attrs["x0"], attrs["n"], attrs["bits"]))
        return bb.emit_te(
            elementwise.shiftgelu,
            *inputs,
            table,
            **attrs,
            lo=span[0],
            primfunc_name_hint=name,
            primfunc_attrs={INJECTIVE_ATTR: 1},
        )
    _static_last_dim(inputs[0], op)
    kernel = rows.shiftmax if op == "Shiftmax" else rows.ilayernorm
    return bb.emit_te(
        kernel,
        *inputs,
        **attrs,
        primfunc_name_hint=name,
        primfunc_attrs={rows.KERNEL_ATTR: op, "op_pattern": OPAQUE},
    )


def _converter_class(op: str):
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    def _impl_v1(cls, bb, inputs, attr, params):
        return _convert(op, bb, inputs, attr)

    return type(f"Ivit{op}", (fe.OnnxOpConverter,), {"_impl_v1": classmethod(_impl_v1)})


@contextlib.contextmanager
def ivit_converters():
    """Within this block, ``from_onnx`` converts ``Requantize``, ``IAdd``, ``ShiftGELU``, ``Shiftmax`` and
    ``ILayerNorm`` nodes to the kernels of this package (the frontend's table is restored on exit)."""
    from tvm.relax.frontend.onnx import onnx_frontend as fe

    original = fe._get_convert_map
    extra = {op: _converter_class(op) for op in OPS}

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
