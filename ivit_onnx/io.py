"""Loading models with one-line errors: missing file, not ONNX, truncated, unreadable IR."""

from __future__ import annotations

import os

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from .errors import ConversionError

#: onnxruntime 1.31 reads IR versions up to this
MAX_IR_VERSION = 10


def load_model(model) -> onnx.ModelProto:
    """A ModelProto from a path or a ModelProto (copied), or :class:`ConversionError`."""
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    path = os.fspath(model)
    if not os.path.isfile(path):
        raise ConversionError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            proto = onnx.ModelProto.FromString(f.read())
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ConversionError(f"{path}: not an ONNX model or truncated ({type(e).__name__})") from None
    if not proto.graph.node:
        raise ConversionError(f"{path}: not an ONNX model (no graph nodes)")
    try:
        onnx.checker.check_model(skeleton(proto))
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise ConversionError(f"{path}: invalid ONNX model: {first}") from None
    return proto


#: initializers larger than this (bytes) are left out of :func:`skeleton`
_SKELETON_LIMIT = 4096


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with large initializers turned into typed graph inputs: checks and shape inference on it
    cost no copy of the weights (small initializers, such as Reshape targets, stay as values)."""
    out = onnx.ModelProto()
    out.ir_version, out.producer_name = model.ir_version, model.producer_name
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    g = out.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    names = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        if t.ByteSize() <= _SKELETON_LIMIT:
            g.initializer.append(t)
        elif t.name not in names:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> np.ndarray:
    """QuantizeLinear's semantics in numpy: round half to even, saturate to the zero point's type."""
    if scale.size > 1:
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    info = np.iinfo(zp.dtype)
    q = np.rint(x.astype(np.float64) / scale) + zp.astype(np.float64)
    return np.clip(q, info.min, info.max).astype(zp.dtype)


def fold_quantized_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A new model in which QuantizeLinear of float initializers (torch's weight export) is an integer
    initializer. Built as a fresh message so the caller can drop the old one: protobuf arenas free the
    float weights only with the whole message, and peak memory stays near one copy of the file."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    folded: dict[str, np.ndarray] = {}
    for n in g.node:
        if (
            n.op_type == "QuantizeLinear"
            and n.input[0] in inits
            and all(i in inits for i in n.input[1:] if i)
            and len(n.input) >= 3
            and n.input[2]
        ):
            x = numpy_helper.to_array(inits[n.input[0]])
            if x.dtype.kind == "f":
                a = next((a.i for a in n.attribute if a.name == "axis"), 1)
                folded[n.output[0]] = quantize(
                    x, numpy_helper.to_array(inits[n.input[1]]), numpy_helper.to_array(inits[n.input[2]]), a
                )
    if not folded:
        return model
    out = onnx.ModelProto()
    out.ir_version, out.producer_name, out.producer_version = (
        model.ir_version,
        model.producer_name,
        model.producer_version,
    )
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.metadata_props.extend(model.metadata_props)
    og = out.graph
    og.name = g.name
    og.node.extend(n for n in g.node if n.output[0] not in folded or n.op_type != "QuantizeLinear")
    og.input.extend(g.input)
    og.output.extend(g.output)
    og.value_info.extend(g.value_info)
    used = {i for n in og.node for i in n.input} | {o.name for o in g.output}
    og.initializer.extend(t for t in g.initializer if t.name in used)
    og.initializer.extend(numpy_helper.from_array(q, name) for name, q in folded.items())
    return out


#: the function bodies use CastLike (opset 15)
MIN_OPSET = 15


def ensure_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Models at opset 13 or 14 are converted up to 15: the private ops' bodies need CastLike."""
    version = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)
    if version >= MIN_OPSET or version < 13:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # noqa: BLE001 - the converter raises several types; one line for the user
        raise ConversionError(
            f"cannot upgrade opset {version} to {MIN_OPSET}: {str(e).splitlines()[0]}"
        ) from None
