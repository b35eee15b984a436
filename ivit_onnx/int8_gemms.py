"""int8 x int8 GEMMs in stock onnxruntime (the functions backend), exact on every CPU.

onnxruntime's int8 x int8 MatMulInteger adds pairs of products in int16 on ARM cores without a dot product
(Cortex-A72, A64FX): two products -128 x -128 sum to 32768 and wrap. Where the probe (``opset/gemm_probe.py``)
finds that, and finds the uint8 forms exact, each int8 operand is moved to uint8 by standard ops,
``u = uint8(int32(x) + 128)`` with its zero point moved the same way, which leaves every ``x - zero_point``
and so the int32 sums unchanged: activations x constant weights become uint8 x int8 (uint8 x uint8 where a
weight is -128, which onnxruntime's uint8 x int8 kernel there turns back into -128 x -128), activations x
activations uint8 x uint8.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: 8-bit GEMMs: op -> (A, B) input indices; their zero points are inputs 2 and 3
GEMMS = {"MatMulInteger": (0, 1), "ConvInteger": (0, 1)}


@functools.lru_cache(maxsize=1)
def wraps() -> str:
    """What the probe found wrong with int8 x int8 on this CPU ("" where it is exact, or where the uint8
    forms that would replace it are not exact either)."""
    from ivit_onnx.opset import gemm_probe

    wrong = gemm_probe.inexact()
    slow = "; ".join(f"{k} {v}" for k, v in wrong.items() if k not in gemm_probe.FAST)
    return slow if slow and not any(k in wrong for k in gemm_probe.FAST) else ""


def _int8(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """The int8 tensors of the main graph, and those that are constants (initializers, Constant outputs)."""
    from ivit_onnx.opset.ort_library import _value_dtypes

    types = _value_dtypes(model)
    g = model.graph
    consts = {t.name for t in g.initializer} | {n.output[0] for n in g.node if n.op_type == "Constant"}
    return {k for k, v in types.items() if v == np.int8}, consts


def _has_min(g: onnx.GraphProto, name: str) -> bool:
    """Whether the constant ``name`` holds -128 (a Constant node's value is taken as holding it)."""
    for t in g.initializer:
        if t.name == name:
            return bool((numpy_helper.to_array(t) == -128).any())
    return True


def as_uint8(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose int8 x int8 GEMMs read uint8 activations (and uint8 B where B is an
    activation too), exactly; and how many GEMMs changed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    int8, consts = _int8(model)
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
        sides = GEMMS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if sides and all(node.input[i] in int8 for i in sides):
            # constant weights in [-127, 127] stay int8 (uint8 x int8: the kernel moves A back to int8, so a
            # -128 weight meets -128 again); an activation B, or weights with -128, move too (uint8 x uint8)
            b = node.input[sides[1]]
            move_b = b not in consts or _has_min(g, b)
            for side in (s for s in sides if s == sides[0] or move_b):
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
            changed += 1
        new_nodes.extend(nodes)
        nodes.clear()
        new_nodes.append(node)
    del g.node[:]
    g.node.extend(new_nodes)
    return out, changed


def exact_int8_gemms(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as is where onnxruntime's int8 x int8 GEMMs are exact on this CPU, else :func:`as_uint8`."""
    return as_uint8(model)[0] if wraps() else model


__all__ = ["as_uint8", "exact_int8_gemms", "wraps"]
