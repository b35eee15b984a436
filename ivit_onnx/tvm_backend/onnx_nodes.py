"""Small readers of ONNX nodes shared by the TVM hand-off's graph rewrites (:mod:`.conv`, :mod:`.wrap`)."""

from __future__ import annotations

import onnx
from onnx import helper


def node_attrs(node: onnx.NodeProto) -> dict:
    """A node's attributes as ``{name: python value}``."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


__all__ = ["node_attrs"]
