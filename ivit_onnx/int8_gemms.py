"""8-bit GEMMs in stock onnxruntime (the functions backend) in forms that are exact on the CPU at hand.

onnxruntime's int8 x int8 MatMulInteger adds pairs of products in int16 on ARM cores without a dot product
(Cortex-A72, A64FX): two products -128 x -128 sum to 32768 and wrap; its uint8 x int8 kernel there moves
A back to int8, so a weight of -128 meets -128 again. Where the probe (``opset/gemm_probe.py``) finds that,
and finds the uint8 forms exact, each int8 operand is moved to uint8 by standard ops,
``u = uint8(int32(x) + 128)`` with its zero point moved the same way, which leaves every ``x - zero_point``
and so the int32 sums unchanged: activations x constant weights become uint8 x int8 (uint8 x uint8 where a
weight is -128), activations x activations uint8 x uint8; a uint8 x int8 GEMM of the model's own (from a
uint8-activation quantizer) gets its B moved too where B holds -128 or is an activation.

Every ConvInteger runs as uint8 x uint8, on every CPU where the probe finds that form exact: onnxruntime
1.31's ConvInteger with an int8 operand wraps on a Cortex-A72 (int8 x int8, int8 x uint8), is wrong on
Haswell (int8 x uint8), and is ~4x slower than uint8 x uint8 (measured; ``engines/onnxruntime/u8_gemm.py``).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: 8-bit GEMMs: op -> (A, B) input indices; their zero points are inputs 2 and 3
GEMMS = {"MatMulInteger": (0, 1), "ConvInteger": (0, 1)}
#: the probe's ConvInteger forms this module writes
CONV_FORMS = ("conv_u8u8", "conv_u8u8_dw")


@functools.lru_cache(maxsize=1)
def probe() -> dict[str, str]:
    """The probe's inexact forms on this CPU (form -> what it gave), run once per process."""
    from ivit_onnx.opset import gemm_probe

    return gemm_probe.inexact()


def wraps() -> str:
    """What the probe found wrong with int8 x int8 on this CPU ("" where it is exact, or where the uint8
    forms that would replace it are not exact either)."""
    from ivit_onnx.opset import gemm_probe

    wrong = probe()
    slow = "; ".join(f"{k} {v}" for k, v in wrong.items() if k not in gemm_probe.FAST)
    return slow if slow and not any(k in wrong for k in gemm_probe.FAST) else ""


def uint8_convs() -> bool:
    """Whether the probe finds the uint8 x uint8 ConvInteger forms exact on this CPU."""
    return not any(f in probe() for f in CONV_FORMS)


def _types(model: onnx.ModelProto) -> tuple[dict[str, np.dtype], set[str]]:
    """The main graph's tensor types, and which tensors are constants (initializers, Constant outputs)."""
    from ivit_onnx.opset.ort_library import _value_dtypes

    g = model.graph
    consts = {t.name for t in g.initializer} | {n.output[0] for n in g.node if n.op_type == "Constant"}
    return _value_dtypes(model), consts


def _has_min(g: onnx.GraphProto, name: str) -> bool:
    """Whether the constant ``name`` holds -128 (a Constant node's value is taken as holding it)."""
    for t in g.initializer:
        if t.name == name:
            return bool((numpy_helper.to_array(t) == -128).any())
    return True


def _moves(node: onnx.NodeProto, types: dict, consts: set[str], g: onnx.GraphProto, matmuls: bool,
           convs: bool) -> tuple[int, ...]:
    """The int8 operands of one GEMM to move to uint8 (see the module docstring)."""
    a, b = (node.input[i] for i in GEMMS[node.op_type])
    int8 = [types.get(a) == np.int8, types.get(b) == np.int8]
    if node.op_type == "ConvInteger":
        return tuple(i for i in (0, 1) if int8[i]) if convs else ()
    if not matmuls or not int8[1]:
        return ()
    # constant weights in [-127, 127] stay int8 (uint8 x int8: the kernel moves A back to int8, so a -128
    # weight meets -128 again); an activation B, or weights with -128, move too (uint8 x uint8)
    move_b = b not in consts or _has_min(g, b)
    if int8[0]:
        return (0, 1) if move_b else (0,)
    return (1,) if types.get(a) == np.uint8 and move_b else ()


def as_uint8(model: onnx.ModelProto, matmuls: bool = True, convs: bool = True) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose MatMulIntegers (``matmuls``) and ConvIntegers (``convs``) read their int8
    operands as uint8 where the module docstring says, exactly; and how many GEMMs changed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    types, consts = _types(model)
    c128 = "ivit_u8_shift_128"
    g.initializer.append(numpy_helper.from_array(np.array(128, np.int32), c128))
    moved: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []

    def shifted(name: str, tag: str) -> str:
        """``name`` + 128 as uint8 (built once per tensor)."""
        if name not in moved:
            base = f"{tag}_u8"
            nodes.extend([
                helper.make_node("Cast", [name], [f"{base}_i32"], name=f"{base}_i32", to=TensorProto.INT32),
                helper.make_node("Add", [f"{base}_i32", c128], [f"{base}_sum"], name=f"{base}_add"),
                helper.make_node("Cast", [f"{base}_sum"], [base], name=base, to=TensorProto.UINT8),
            ])
            moved[name] = base
        return moved[name]

    changed = 0
    new_nodes: list[onnx.NodeProto] = []
    for node in g.node:
        sides = _moves(node, types, consts, g, matmuls, convs) if (
            node.op_type in GEMMS and node.domain in ("", "ai.onnx")) else ()
        for side in sides:
            tag = f"{node.name or node.output[0]}_{'ab'[side]}"
            zp_at = 2 + side
            zp = node.input[zp_at] if len(node.input) > zp_at and node.input[zp_at] else None
            node.input[side] = shifted(node.input[side], tag)
            while len(node.input) <= zp_at:
                node.input.append("")
            if zp is None:
                zero = f"{tag}_zero_u8"
                g.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), zero))
                node.input[zp_at] = zero
            else:
                node.input[zp_at] = shifted(zp, f"{tag}_zero")
        changed += bool(sides)
        new_nodes.extend(nodes)
        nodes.clear()
        new_nodes.append(node)
    del g.node[:]
    g.node.extend(new_nodes)
    return out, changed


def exact_int8_gemms(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its GEMMs in this CPU's exact forms (:func:`as_uint8`); as is where nothing changes."""
    out, changed = as_uint8(model, matmuls=bool(wraps()), convs=uint8_convs())
    return out if changed else model


__all__ = ["as_uint8", "exact_int8_gemms", "probe", "uint8_convs", "wraps"]
