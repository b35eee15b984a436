"""Turn an integer model into a plain default-domain ONNX graph that TVM's ONNX frontend imports exactly."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
from onnx import helper, numpy_helper

from ivit_onnx.conv_gemm import rewrite_conv_integer
from ivit_onnx.opset import DOMAIN
from ivit_onnx.opset.functions import attach_functions, used_ops

from .static_shapes import fold_static_shapes
from .wrap import rewrite_biased_shifts, unsigned_arithmetic

#: domains TVM's frontend knows; it ignores the domain of every other node and maps it by op_type
DEFAULT_DOMAINS = ("", "ai.onnx")

_CONSTANT_ATTRS = {
    "value_int": lambda a: np.array(a.i, np.int64),
    "value_ints": lambda a: np.array(list(a.ints), np.int64),
    "value_float": lambda a: np.array(a.f, np.float32),
    "value_floats": lambda a: np.array(list(a.floats), np.float32),
}


def _constant_values_as_tensors(graph: onnx.GraphProto) -> int:
    """Rewrite ``Constant(value_int[s]/value_float[s])`` to ``value=`` tensors (TVM accepts only those)."""
    count = 0
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                count += _constant_values_as_tensors(sub)
        if node.op_type != "Constant" or node.domain not in DEFAULT_DOMAINS:
            continue
        for attr in list(node.attribute):
            if attr.name in _CONSTANT_ATTRS:
                arr = _CONSTANT_ATTRS[attr.name](attr)
                node.attribute.remove(attr)
                node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(arr)))
                count += 1
    return count


def foreign_nodes(graph: onnx.GraphProto) -> list[str]:
    """``name (domain.op_type)`` of every node, subgraphs included, outside the default domain."""
    found = []
    for node in graph.node:
        if node.domain not in DEFAULT_DOMAINS:
            found.append(f"{node.name or '?'} ({node.domain}.{node.op_type})")
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                found += foreign_nodes(sub)
    return found


def prepare_for_tvm(model: onnx.ModelProto, keep_ops=(), shapes: dict | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with the private ops inlined from fresh bodies, in forms TVM imports bit-exactly.

    ``keep_ops``: private op types left as ``ai.ivit`` nodes (not inlined), for the frontend converters
    of :mod:`.kernels` (imported within ``kernels.ivit_converters()``). ``shapes``: the inputs' fixed
    shapes (name -> dims) of the build; what the graph computes from shapes is folded at them
    (:mod:`.static_shapes`), so every tensor reaches relax with a static shape.

    The result is meant for TVM only: general ConvInteger becomes an int32 ``Conv`` and wrapping uint64
    floor shifts signed BitShifts, which onnxruntime does not run (:mod:`.conv`, :mod:`.wrap`).
    Raises ``ValueError`` if a node outside the default domain survives inlining, or unsigned
    Add/Sub/Mul remain (TVM treats their wrap-around as undefined).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if used_ops(out):
        attach_functions(out)  # the bodies that match the reference kernels, whatever the file carried
    if shapes:
        fold_static_shapes(out, shapes)
    kept = [f for f in out.functions if f.domain == DOMAIN and f.name in keep_ops]
    for f in kept:
        out.functions.remove(f)
    out = onnx.inliner.inline_local_functions(out, convert_version=False)
    del out.functions[:]
    keep = [i for i in out.opset_import if i.domain in DEFAULT_DOMAINS or (kept and i.domain == DOMAIN)]
    del out.opset_import[:]
    out.opset_import.extend(keep)
    left = [n for n in foreign_nodes(out.graph) if not any(n.endswith(f"({DOMAIN}.{op})") for op in keep_ops)]
    if left:
        raise ValueError(f"nodes outside the default domain after inlining (TVM would map them by op_type): "
                         f"{left[:10]}{' ...' if len(left) > 10 else ''}")
    _constant_values_as_tensors(out.graph)
    rewrite_biased_shifts(out)
    wrapping = unsigned_arithmetic(out)
    if wrapping:
        raise ValueError(f"unsigned Add/Sub/Mul (TVM compiles them as non-wrapping, nuw): {wrapping[:10]}")
    rewrite_conv_integer(out)
    return out


__all__ = ["DEFAULT_DOMAINS", "DOMAIN", "foreign_nodes", "prepare_for_tvm"]
