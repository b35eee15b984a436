"""Fold what a model computes from its tensors' shapes, at the fixed input shapes a TVM build compiles for.

Exporters keep the batch symbolic and compute shape-derived values at run time (a class token
``Expand``-ed to ``Where(Equal(Reshape(Concat(Shape(x)[0], 1, 1)), -1), 1, ...)``). Relax's ONNX frontend
cannot follow such a value through ``Where``/``Equal``, so the tensor it shapes gets no static shape and the
kernels' ``emit_te`` refuses it. At the shapes of one build these values are numbers: this module gives the
graph inputs those shapes, infers every tensor's shape (ONNX shape inference with data propagation, on a copy
with the function bodies inlined), and replaces each ``Shape``/``Size`` of a static tensor, and every
default-domain node computed only from those and constants, by an initializer (evaluated by
``onnx.reference``), until nothing changes.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

#: domains of the nodes this module evaluates
_DEFAULT = ("", "ai.onnx")
#: ops whose value is not a function of their inputs
_NONDETERMINISTIC = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
                     "Multinomial")
#: a folded value larger than this stays computed at run time (elements)
SIZE_LIMIT = 1 << 20
ROUNDS = 8


def with_input_shapes(model: onnx.ModelProto, shapes: dict) -> None:
    """Set the dimensions of the graph inputs named in ``shapes`` (in place)."""
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[vi.name]:
                dims.add().dim_value = int(d)


def static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The fully static shapes ONNX shape inference (with data propagation) finds for the main graph's
    tensors, the private ops' bodies inlined so that inference sees through them."""
    flat = onnx.inliner.inline_local_functions(model, convert_version=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(flat, data_prop=True)
    except Exception:  # noqa: BLE001 - a graph ONNX cannot infer: nothing is folded, relax says what it lacks
        return {}
    out = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = [d.dim_value for d in t.shape.dim]
    return out


def _shape_value(node: onnx.NodeProto, shape: list[int]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape, dtype=np.int64)), np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    return np.array(shape[slice(start + rank if start < 0 else start, end + rank if end < 0 else end)],
                    np.int64)


def _evaluate(model: onnx.ModelProto, node: onnx.NodeProto, values: dict) -> list[np.ndarray] | None:
    """``node`` on constant inputs, at the model's opsets (None if onnx.reference cannot run it)."""
    graph = onnx.helper.make_graph(
        [node], "fold", [], [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o],
        [numpy_helper.from_array(np.asarray(values[i]), i) for i in node.input if i])
    sub = onnx.helper.make_model(graph, opset_imports=[o for o in model.opset_import if o.domain in _DEFAULT],
                                 ir_version=model.ir_version)
    try:
        return list(ReferenceEvaluator(sub).run(None, {}))
    except Exception:  # noqa: BLE001 - an op onnx.reference lacks: the value stays computed at run time
        return None


def _fold_once(model: onnx.ModelProto) -> int:
    """One round: fold the shape-derived values the current shapes make constant; returns how many nodes."""
    graph = model.graph
    shapes = static_shapes(model)
    inits = {t.name: t for t in graph.initializer}
    constant_nodes = {n.output[0]: n for n in graph.node if n.op_type == "Constant" and n.domain in _DEFAULT}
    derived: dict[str, np.ndarray] = {}  # values that depend on a folded Shape/Size

    def value(name: str):
        if name in derived:
            return derived[name]
        if name in inits:
            return numpy_helper.to_array(inits[name])
        out = _evaluate(model, constant_nodes[name], {}) if name in constant_nodes else None
        return None if out is None else out[0]

    folded = []
    for node in graph.node:
        if node.domain not in _DEFAULT or node.op_type in _NONDETERMINISTIC:
            continue
        if node.op_type in ("Shape", "Size"):
            if node.input[0] in shapes:
                derived[node.output[0]] = _shape_value(node, shapes[node.input[0]])
                folded.append(node)
            continue
        known = [i for i in node.input if i]
        if not any(i in derived for i in known):
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        inputs = {i: value(i) for i in known}
        if any(v is None for v in inputs.values()):
            continue
        values = _evaluate(model, node, inputs)
        if values is None or any(np.asarray(v).size > SIZE_LIMIT for v in values):
            continue
        derived.update(zip(node.output, values, strict=False))
        folded.append(node)
    if not folded:
        return 0
    gone = {id(n) for n in folded}
    keep = [n for n in graph.node if id(n) not in gone]
    used = {i for n in keep for i in n.input} | {o.name for o in graph.output}
    for name in sorted(used & set(derived)):
        graph.initializer.append(numpy_helper.from_array(np.asarray(derived[name]), name))
    del graph.node[:]
    graph.node.extend(keep)
    names = {t.name for t in graph.initializer}
    kept_info = [vi for vi in graph.value_info if vi.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return len(folded)


def fold_static_shapes(model: onnx.ModelProto, shapes: dict) -> int:
    """Give the inputs ``shapes`` (name -> dims) and fold every shape-derived value (in place); returns the
    number of nodes folded."""
    with_input_shapes(model, shapes)
    total = 0
    for _ in range(ROUNDS):
        n = _fold_once(model)
        total += n
        if not n:
            break
    return total


__all__ = ["fold_static_shapes", "static_shapes", "with_input_shapes"]
