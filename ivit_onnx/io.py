"""Loading models with one-line errors: missing file, not ONNX, truncated, unreadable IR."""

from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError

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
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        raise ConversionError(f"{path}: invalid ONNX model: {first}") from None
    return proto
