"""ONNX export of float and fake-quant models with either torch exporter, readable by onnxruntime 1.31."""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch
from onnx import version_converter

from ivit_onnx.io import default_opset

from . import quant

EXPORTERS = ("torchscript", "dynamo")
INPUT_NAME, OUTPUT_NAME = "input", "logits"
IR_VERSION = 10  # onnx 1.23 writes IR 14 by default; onnxruntime 1.31 reads at most 13
INT16_MIN_OPSET = 21  # QuantizeLinear/DequantizeLinear accept int16 from opset 21
DYNAMO_MIN_OPSET = 18  # the dynamo exporter's op library starts at opset 18
# Reduce ops that gained `noop_with_empty_axes` (and axes as an input) in opset 18; ReduceSum had it at 13.
REDUCE_OPS_18 = {
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
}


def _has_int16_qdq(model: onnx.ModelProto) -> bool:
    """Whether any QuantizeLinear/DequantizeLinear zero point is int16 (initializer, Constant, or an
    Identity of one: the TorchScript exporter deduplicates equal initializers through Identity nodes)."""
    int16 = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT16}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute[0].t.data_type == onnx.TensorProto.INT16:
            int16.add(node.output[0])
        if node.op_type == "Identity" and node.input[0] in int16:
            int16.add(node.output[0])
    return any(
        n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2 and n.input[2] in int16
        for n in model.graph.node
    )


def _convert_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`onnx.version_converter`, plus the one gap we hit: going below 18 it moves Reduce* axes back to
    an attribute but keeps `noop_with_empty_axes`; dropped here when 0 (its default, so same meaning)."""
    model = version_converter.convert_version(model, opset)
    if opset < 18:
        for node in model.graph.node:
            if node.op_type in REDUCE_OPS_18:
                kept = [a for a in node.attribute if not (a.name == "noop_with_empty_axes" and a.i == 0)]
                del node.attribute[:]
                node.attribute.extend(kept)
    return model


def _export_torchscript(module: torch.nn.Module, example: torch.Tensor, path: Path, opset: int) -> None:
    quant.register_torchscript_symbolics()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated; it still works
        torch.onnx.export(
            module,
            (example,),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )


def _export_dynamo(module: torch.nn.Module, example: torch.Tensor, path: Path, opset: int) -> None:
    """Export at opset >= 18 (lower ones are reached by `onnx.version_converter` in `export_onnx`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (example,),
            str(path),
            dynamo=True,
            opset_version=max(opset, DYNAMO_MIN_OPSET),
            external_data=False,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            custom_translation_table=quant.onnx_translation_table(),
            verbose=False,
        )


def export_onnx(
    module: torch.nn.Module,
    example_input: torch.Tensor,
    path: str | Path,
    exporter: str = "torchscript",
    opset: int = 17,
) -> onnx.ModelProto:
    """Export `module` (float or fake-quant; set to eval mode) to `path`: input "input", output "logits",
    dynamic batch; returns the saved model.

    The file gets IR version 10 so onnxruntime 1.31 loads it. The dynamo exporter starts at opset 18;
    a lower `opset` is reached with `onnx.version_converter` (as torch itself would do, but quietly and
    with a fix for Reduce* attributes).
    int16 Q/DQ (residual_bits=16) needs opset 21: with a lower `opset` the model is exported as asked,
    then converted to opset 21 with `onnx.version_converter` (op forms such as the Erf-based GELU stay
    as the lower opset emitted them). onnxruntime 1.31 loads opset-21 QDQ models only without its QDQ
    propagation (`runtime.ort_session` takes care of that).
    """
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    path = Path(path)
    module = module.eval()
    with torch.no_grad():
        if exporter == "torchscript":
            _export_torchscript(module, example_input, path, opset)
        else:
            _export_dynamo(module, example_input, path, opset)
    model = onnx.load(str(path))
    if opset < INT16_MIN_OPSET and _has_int16_qdq(model):
        opset = INT16_MIN_OPSET
    if default_opset(model) != opset:
        model = _convert_opset(model, opset)
    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model
