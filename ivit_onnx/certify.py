"""The integer-only certificate: no float tensor between the input quantize and the output dequantize.

Checked per node and per tensor after inlining the private ops' function bodies and running shape
inference, so a float inside a body is caught too (and named by its call site). Allowed float: graph
inputs read only by QuantizeLinear (as its ``x``), the scale operands of QuantizeLinear/DequantizeLinear
(and the Constants producing them), and DequantizeLinear outputs that are graph outputs read by no node.
:func:`opset_problems` checks that every non-standard op is a known op of the private opset.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, inliner

STANDARD_DOMAINS = ("", "ai.onnx")


class Offender(NamedTuple):
    """A float tensor inside the integer region: the node that makes it, the tensor, its type."""

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


def call_sites(model: onnx.ModelProto, flat: onnx.ModelProto) -> list[onnx.NodeProto | None]:
    """For each node of ``flat`` (``model`` with local functions inlined), the call it came from, or None.

    The inliner expands each call in place, so the main graph's nodes are walked in order, each call
    standing for as many nodes as its (recursively expanded) body. All None if the counts disagree.
    """
    funcs = {(f.domain, f.name): f for f in model.functions}

    def size(nodes, depth=0) -> int:
        if depth > 16:
            raise RecursionError("local functions nested too deep")
        return sum(size(funcs[(n.domain, n.op_type)].node, depth + 1) if (n.domain, n.op_type) in funcs
                   else 1 for n in nodes)

    owners: list[onnx.NodeProto | None] = []
    for n in model.graph.node:
        key = (n.domain, n.op_type)
        owners += [n] * size(funcs[key].node) if key in funcs else [None]
    return owners if len(owners) == len(flat.graph.node) else [None] * len(flat.graph.node)


def _call_sites(model: onnx.ModelProto, flat: onnx.ModelProto) -> list[str]:
    """A label per node of the inlined graph: the node itself, or ``Call 'name' > body Op 'x'``."""
    return [f"{_label(call)} > body {_label(fn)}" if call is not None else _label(fn)
            for call, fn in zip(call_sites(model, flat), flat.graph.node, strict=True)]


def float_offenders(model: onnx.ModelProto) -> list[Offender]:
    """Every float (or untyped) tensor that is not an allowed boundary tensor, with the node that touches it.

    Raises ``onnx.shape_inference.InferenceError`` when strict shape inference fails.
    """
    flat = inliner.inline_local_functions(model)
    flat = onnx.shape_inference.infer_shapes(flat, strict_mode=True)
    labels = _call_sites(model, flat)
    types = _dtypes(flat)
    g = flat.graph
    inputs = {i.name for i in g.input}
    outputs = {o.name for o in g.output}
    producers = {o: n for n in g.node for o in n.output}

    def is_float(t: str) -> bool:
        dt = types.get(t)
        return dt is None or np.dtype(dt).kind == "f"

    def dtype_name(t: str) -> str:
        return "untyped" if types.get(t) is None else np.dtype(types[t]).name

    # allowed (node, tensor) touches: the scale operands and the boundary quantize/dequantize
    allowed: set[tuple[int, str]] = set()
    inputs |= _input_casts(g, inputs, allowed)
    scale_consts: set[str] = set()
    for i, n in enumerate(g.node):
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.domain in STANDARD_DOMAINS:
            for s in n.input[1:2]:
                allowed.add((i, s))
                if s in producers and producers[s].op_type == "Constant":
                    scale_consts.add(s)
            if n.op_type == "QuantizeLinear" and n.input[0] in inputs:
                allowed.add((i, n.input[0]))
            if n.op_type == "DequantizeLinear" and n.output[0] in outputs:
                allowed.add((i, n.output[0]))
    for i, n in enumerate(g.node):
        if n.op_type == "Constant" and n.output[0] in scale_consts:
            allowed.add((i, n.output[0]))
    bad, seen = [], set()
    for i, n in enumerate(g.node):
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            bad.append(Offender(labels[i], n.output[0] if n.output else "", "control flow (not certified)"))
        for t in [*n.input, *n.output]:
            if not t or (i, t) in allowed or not is_float(t):
                continue
            if (labels[i], t) in seen:
                continue
            seen.add((labels[i], t))
            bad.append(Offender(labels[i], t, dtype_name(t)))
    touched = {t for _, t in allowed}
    for o in outputs:
        if is_float(o) and o not in touched and not any(b.tensor == o for b in bad):
            bad.append(Offender("graph output", o, dtype_name(o)))
    return bad


def _input_casts(g: onnx.GraphProto, inputs: set[str], allowed: set[tuple[int, str]]) -> set[str]:
    """The outputs of float → float Casts of a graph input that only QuantizeLinear (as ``x``) or more such
    Casts read (a float16 input cast to float32 before the input quantize): input conversions in front of the
    integer region, allowed like the input itself; their touches are added to ``allowed``."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    index = {id(n): i for i, n in enumerate(g.node)}

    def feeds_quantize(t: str, depth: int = 0) -> bool:
        return bool(readers.get(t)) and depth < 8 and all(
            (r.op_type == "QuantizeLinear" and r.input[0] == t)
            or (r.op_type == "Cast" and feeds_quantize(r.output[0], depth + 1))
            for r in readers[t]
        )

    out: set[str] = set()
    todo = [t for t in inputs if feeds_quantize(t)]
    while todo:
        t = todo.pop()
        for r in readers.get(t, []):
            if r.op_type == "Cast" and r.output[0] not in out:
                allowed.update({(index[id(r)], t), (index[id(r)], r.output[0])})
                out.add(r.output[0])
                todo.append(r.output[0])
    return out


def is_integer_only(model: onnx.ModelProto) -> bool:
    return not float_offenders(model)


def opset_problems(model: onnx.ModelProto) -> list[str]:
    """Non-standard ops that are not private ops at this version, or with wrong dtypes or attributes."""
    from ivit_onnx.opset import DOMAIN, OPS, VERSION

    problems = []
    imports = {i.domain: i.version for i in model.opset_import}
    types = _dtypes(onnx.shape_inference.infer_shapes(model))
    used = [n for n in model.graph.node if n.domain not in STANDARD_DOMAINS]
    if used and any(n.domain == DOMAIN for n in used) and imports.get(DOMAIN) != VERSION:
        problems.append(f"opset import {DOMAIN} version {imports.get(DOMAIN)}; this ivit_onnx has {VERSION}")
    for n in used:
        if n.domain != DOMAIN:
            problems.append(f"{_label(n)}: unknown domain '{n.domain}' (allowed: default, {DOMAIN})")
            continue
        spec = OPS.get(n.op_type)
        if spec is None:
            problems.append(f"{_label(n)}: unknown op {DOMAIN}.{n.op_type} (known: {', '.join(OPS)})")
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        dts = [types.get(t) for t in n.input]
        if any(d is None for d in dts):
            problems.append(f"{_label(n)}: input types unknown after shape inference")
            continue
        try:
            spec.check(dts, attrs, where=_label(n))
        except ValueError as e:
            problems.append(str(e))
    return problems
