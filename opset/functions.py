"""Attach the private ops' function bodies to a model, so it runs in stock onnxruntime/onnx.reference."""

from __future__ import annotations

import onnx
from onnx import helper

from . import OPS
from ._spec import DOMAIN, VERSION


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise ValueError("model imports no default-domain opset")


def used_ops(model: onnx.ModelProto) -> list[str]:
    """Names of the private ops used by the main graph, sorted."""
    return sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN})


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace any ``ai.ivit`` functions by fresh bodies for the ops in use; import the domain (in place)."""
    opset = default_opset(model)
    names = used_ops(model)
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise ValueError(f"unknown {DOMAIN} ops: {unknown}")
    keep = [f for f in model.functions if f.domain != DOMAIN]
    del model.functions[:]
    model.functions.extend(keep + [OPS[n].function(opset) for n in names])
    if not any(i.domain == DOMAIN for i in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    return model
