"""Attach the private ops' function bodies to a model, so it runs in stock onnxruntime/onnx.reference."""

from __future__ import annotations

import onnx
from onnx import helper

from ivit_onnx.io import default_opset

from . import OPS
from ._spec import DOMAIN, VERSION


def used_ops(model: onnx.ModelProto) -> list[str]:
    """Names of the private ops used by the main graph, sorted."""
    return sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN})


def with_bodies(functions: list, names: list[str], opset: int) -> list:
    """``functions`` without ``ai.ivit`` ones, plus a fresh body (for ``opset``) for each private op named."""
    unknown = [n for n in names if n not in OPS]
    if unknown:
        raise ValueError(f"unknown {DOMAIN} ops: {unknown}")
    if not opset:
        raise ValueError("model imports no default-domain opset")
    return [f for f in functions if f.domain != DOMAIN] + [OPS[n].function(opset) for n in names]


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace any ``ai.ivit`` functions by fresh bodies for the ops in use; import the domain (in place).
    (The converter's ``attach_functions`` pass does the same on its graph, with :func:`with_bodies`.)"""
    functions = with_bodies(list(model.functions), used_ops(model), default_opset(model))
    del model.functions[:]
    model.functions.extend(functions)
    if not any(i.domain == DOMAIN for i in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    return model
