"""Constant GEMM weights stored the way every onnxruntime session can load them (the converter's output and
the onnxruntime engine's artifact alike)."""

from __future__ import annotations

import onnx
from onnx import numpy_helper


def unshare_gemm_weights(model: onnx.ModelProto) -> int:
    """Give every constant weight read by several MatMulIntegers a copy of its own (in place; returns the
    number of copies). onnxruntime 1.31's int8 -> uint8 weight conversion (``session.x64quantprecision``,
    which the custom-op library's GEMM self-check turns on for x86 CPUs without VNNI) fails at session
    creation on a shared initializer ("Attempt to replace the existing tensor"); ALBERT shares its layers'
    weights."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    seen: set[str] = set()
    copies = 0
    for n in g.node:
        if n.op_type != "MatMulInteger" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        if n.input[1] in seen:
            name = f"{n.input[1]}__{n.name or n.output[0]}"
            g.initializer.append(numpy_helper.from_array(numpy_helper.to_array(inits[n.input[1]]), name))
            n.input[1] = name
            copies += 1
        seen.add(n.input[1])
    return copies
