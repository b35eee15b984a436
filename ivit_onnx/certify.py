"""The integer-only certificate: no float tensor between the input quantize and the output dequantize.

Checked per node and per tensor after inlining the private ops' function bodies and running shape
inference, so a float inside a body is caught too. Allowed float: graph inputs read only by
QuantizeLinear, the scale operands of QuantizeLinear/DequantizeLinear, and DequantizeLinear outputs
that are graph outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, inliner


@dataclass(frozen=True)
class Offender:
    node: str
    tensor: str
    dtype: str

    def __str__(self) -> str:
        return f"{self.node}: tensor '{self.tensor}' is {self.dtype}"


def _dtypes(model: onnx.ModelProto) -> dict[str, np.dtype]:
    g = model.graph
    out = {t.name: helper.tensor_dtype_to_np_dtype(t.data_type) for t in g.initializer}
    for v in [*g.input, *g.value_info, *g.output]:
        et = v.type.tensor_type.elem_type
        if et:
            out[v.name] = helper.tensor_dtype_to_np_dtype(et)
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = helper.tensor_dtype_to_np_dtype(a.t.data_type)
                elif a.name in ("value_float", "value_floats"):
                    out[n.output[0]] = np.dtype(np.float32)
    return out


def _label(n: onnx.NodeProto) -> str:
    return f"{n.op_type} '{n.name or n.output[0]}'"


def float_offenders(model: onnx.ModelProto) -> list[Offender]:
    """Every float tensor that is not an allowed boundary tensor, with the node that touches it."""
    flat = inliner.inline_local_functions(model)
    flat = onnx.shape_inference.infer_shapes(flat, strict_mode=True)
    types = _dtypes(flat)
    g = flat.graph
    inputs = {i.name for i in g.input}
    outputs = {o.name for o in g.output}
    allowed: set[str] = set()
    for n in g.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            allowed.update(n.input[1:])
        if n.op_type == "QuantizeLinear" and n.input[0] in inputs:
            allowed.add(n.input[0])
        if n.op_type == "DequantizeLinear" and n.output[0] in outputs:
            allowed.add(n.output[0])
    bad, seen = [], set()
    for n in g.node:
        for t in [*n.input, *n.output]:
            if not t or t in allowed or t in seen:
                continue
            dt = types.get(t)
            if dt is None or np.dtype(dt).kind == "f":
                seen.add(t)
                bad.append(Offender(_label(n), t, "untyped" if dt is None else np.dtype(dt).name))
    for o in outputs - allowed:
        dt = types.get(o)
        if dt is None or np.dtype(dt).kind == "f":
            if o not in seen:
                bad.append(Offender("graph output", o, "untyped" if dt is None else np.dtype(dt).name))
    return bad


def is_integer_only(model: onnx.ModelProto) -> bool:
    return not float_offenders(model)
