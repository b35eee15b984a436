"""Resize of a quantized tensor in integers.

- mode ``nearest`` copies elements: the same Resize runs on the integers (exact), given its output ``sizes``
  (its float ``scales`` would be a float tensor in the integer graph; equivalent only where
  ``out / in == scale`` exactly, else it declines).
- modes ``linear`` / ``cubic`` are separable: along each resized axis the output is ``A @ x`` with an
  interpolation matrix ``A`` fixed by the static shapes and the attributes. ``A`` is read off the op itself
  (onnxruntime resizing the identity), and where its weights share a denominator ``D <= 4096`` (``A * D``
  integers: scale 2 with ``half_pixel`` has quarters, scale 3 thirds, ``align_corners`` multiples of
  ``1/(out-1)``), ``(A * D) @ (q - zp)`` is an exact int32 MatMul typed ``s / D``: one rounding at the next
  QuantizeLinear, within one output step of the fake-quant graph (which rounds its float sums). Weights with
  no such denominator (a scale such as 1.2345) have no exact integer form and decline.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ivit_onnx.affine import Affine
from ivit_onnx.graph import const_array
from ivit_onnx.models.runtime import ort_session

from ..pattern import Op, Rule
from .lowerer import Lowerer, Outcome, optional_input
from .select import on_integers

_INT32_MAX = 2**31 - 1
#: the finest weight grid accepted (1/4096): interpolation weights of common scales are coarser
_MAX_DENOMINATOR = 4096
#: how far (in units of ``1/D``) a weight as onnxruntime computes it in float32 may sit from ``k/D``
_TOLERANCE = 1e-3


def _attr(node, key: str, default: str) -> str:
    v = node.attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def _scales(node) -> np.ndarray | None:
    """The full-rank float scales of a Resize (from ``scales``, or ``sizes / in``), None if not static (an
    axis whose input and output are the same symbol, or whose given scale is 1, is not resized: a batch, also
    where shape inference named the output's batch anew, as ``floor(1.0*batch)``)."""
    shape_in, shape_out = node.inputs[0].shape, node.outputs[0].shape
    if shape_in is None or shape_out is None or len(shape_in) != len(shape_out):
        return None
    full, given = np.ones(len(shape_in), np.float64), np.full(len(shape_in), np.nan)
    scales = const_array(optional_input(node, 2))
    if scales is not None and scales.size:
        given[list(node.attrs.get("axes") or range(len(shape_in)))] = scales.astype(np.float64)
    for d, (a, b) in enumerate(zip(shape_in, shape_out, strict=True)):
        if isinstance(a, int) and isinstance(b, int):
            full[d] = b / a
        elif not ((isinstance(a, str) and a == b) or given[d] == 1):
            return None
    return np.where(np.isnan(given), full, given)


def _sizes(node) -> np.ndarray | str:
    """A Resize's output sizes as int64 (the integer graph takes ``sizes``, not float ``scales``), or why
    they cannot stand for the scales (the same output coordinates need ``out / in == scale`` exactly)."""
    sizes = const_array(optional_input(node, 3))
    if sizes is not None:
        return sizes.astype(np.int64)
    scales = const_array(optional_input(node, 2))
    if scales is None:
        return "scales or sizes not constant"
    shape_in, shape_out = node.inputs[0].shape, node.outputs[0].shape
    if _scales(node) is None:
        return "shapes unknown (not static)"
    axes = list(node.attrs.get("axes") or range(len(shape_in)))
    if not all(isinstance(shape_out[a], int) for a in axes):
        return "sizes of a symbolic axis (a batch) unknown (not static)"
    sizes = np.array([shape_out[a] for a in axes], np.int64)
    ratio = np.float32(sizes / np.array([shape_in[a] for a in axes]))
    if not np.array_equal(ratio, scales.astype(np.float32)):
        return f"scales {scales.tolist()} are not the exact ratio of the static sizes {sizes.tolist()}"
    return sizes


def _matrix(lw: Lowerer, node, d: int) -> np.ndarray:
    """The interpolation matrix ``A`` (``out x in``) of ``node`` along axis ``d``: the op itself (float, as
    the fake-quant model runs it) resizing an identity that sits along axis 0 and axis ``d``."""
    rank, n = len(node.inputs[0].shape), node.inputs[0].shape[d]
    shape = [1] * rank
    shape[0] = shape[d] = n
    eye = np.eye(n, dtype=np.float32).reshape(shape)
    scales = np.ones(rank, np.float32)
    scales[d] = _scales(node)[d]
    sizes = list(shape)
    sizes[d] = node.outputs[0].shape[d]
    attrs = {k: v for k, v in node.attrs.items() if k not in ("axes", "keep_aspect_ratio_policy")}
    if const_array(optional_input(node, 2)) is not None:  # the coordinates of the scales given
        inits, args = [onnx.numpy_helper.from_array(scales, "scales")], ["x", "", "scales"]
    else:
        inits = [onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")]
        args = ["x", "", "", "sizes"]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Resize", args, ["y"], **attrs)], "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [onnx.helper.make_opsetid("", lw.ctx.opset)]
    model = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=min(lw.ctx.ir_version, 10))
    y = ort_session(model).run(None, {"x": eye})[0]
    return np.moveaxis(y.reshape(n, -1), 0, 1).astype(np.float64)


def _denominator(a: np.ndarray) -> int | None:
    """The least ``D <= 4096`` with ``a * D`` all integers (to the float32 rounding of weights such as
    ``7/15``), None if there is none."""
    d = math.lcm(*(Fraction(float(v)).limit_denominator(_MAX_DENOMINATOR).denominator for v in np.unique(a)))
    ok = d <= _MAX_DENOMINATOR and np.max(np.abs(a * d - np.rint(a * d)), initial=0) <= _TOLERANCE
    return d if ok else None


def _plan(lw: Lowerer, node) -> list[tuple[int, np.ndarray, int]] | str:
    """``[(axis, integer matrix, D)]`` of an interpolating Resize, or why it has no exact integer form."""
    if _attr(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        return "coordinate mode tf_crop_and_resize extrapolates a constant"
    if _attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return "keep_aspect_ratio_policy other than stretch"
    full = _scales(node)
    if full is None:
        return "shapes unknown (not static)"
    rank = len(node.inputs[0].shape)
    resized = [d for d in range(rank) if full[d] != 1]  # static sizes give their ratio, symbols scale 1
    if rank < 3 or any(d < rank - 2 for d in resized):
        return "it resizes an axis other than the last two of a rank >= 3 tensor"
    plan = []
    for d in resized:
        a = _matrix(lw, node, d)
        den = _denominator(a)
        if den is None:
            why = f"no common denominator <= {_MAX_DENOMINATOR} (scale {full[d]:g}): no exact integer form"
            return f"interpolation weights along axis {d} have {why}"
        plan.append((d, np.rint(a * den).astype(np.int64), den))
    return plan


def _growth(plan) -> int:
    """How much the integer matrices can grow a bound (the largest row sum of |A * D|, multiplied)."""
    return int(np.prod([np.max(np.sum(np.abs(m), axis=1)) for _, m, _ in plan]))


class Resize(Rule):
    """Resize: ``nearest`` on the integers; ``linear``/``cubic`` with rational weights as int32 MatMuls."""

    pattern = Op("Resize")

    def check(self, lw, m):
        node = m.root
        why = lw.missing(node.inputs[0])
        if why is not None:
            return why
        if _attr(node, "mode", "nearest") == "nearest":
            sizes = _sizes(node)
            return sizes if isinstance(sizes, str) else None
        plan = _plan(lw, node)
        if isinstance(plan, str):
            return plan
        a = lw.get(node.inputs[0])[1]
        if a.bound * _growth(plan) > _INT32_MAX:
            return "the interpolated sums could overflow int32"
        return None

    def rewrite(self, lw, m):
        node = m.root
        it, a = lw.per_tensor(*lw.get(node.inputs[0]))
        mode = _attr(node, "mode", "nearest")
        if mode == "nearest":
            sizes = lw.const(_sizes(node), "sizes")
            attrs = {k: v for k, v in node.attrs.items() if k != "keep_aspect_ratio_policy"}
            on_integers(lw, node, "Resize", [it, gs.Variable.empty(), gs.Variable.empty(), sizes], a, attrs)
            lw.ctx.count("lower_integer", "Resize (nearest) on the integers")
            return Outcome.HANDLED
        plan = _plan(lw, node)
        it, a = lw.symmetric(it, a)
        if a.dtype != np.int32:
            it = lw.node("Cast", [it], np.int32, "widen", attrs={"to": np.int32}, shape=it.shape)
        rank = len(node.inputs[0].shape)
        for d, mat, _ in plan:  # the last axis: x @ A^T; the one before: A @ x (numpy broadcasting)
            w = lw.const(np.ascontiguousarray(mat.T if d == rank - 1 else mat).astype(np.int32), "interp")
            it = lw.node("MatMul", [it, w] if d == rank - 1 else [w, it], np.int32, "interp")
        it.shape = node.outputs[0].shape
        den = math.prod(den for _, _, den in plan)
        lw.set(node.outputs[0], it, Affine(a.scale / den, 0, np.int32, bound=a.bound * _growth(plan)))
        lw.ctx.count("lower_integer", f"Resize ({mode}) as int32 MatMuls")
        return Outcome.HANDLED
