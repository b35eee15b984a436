"""Fake-quant ONNX exports of a float torch ViT by the torch-side toolkits, with their documented APIs.

- Brevitas: ``brevitas.graph.quantize.layerwise_quantize`` (int8 weights and inputs of every Linear/Conv,
  int32 biases), calibrated in ``calibration_mode``, exported by ``brevitas.export.export_onnx_qcdq``
  (QuantizeLinear → Clip → DequantizeLinear) or ``export_qonnx`` (QONNX ``Quant``); TorchScript
  exporter, as Brevitas' dynamo path refuses quantized biases.
- PT2E: ``torch.export`` → torchao's ``prepare_pt2e``/``convert_pt2e`` with the ``X86InductorQuantizer``
  (its default config; ``torch.matmul`` enabled too, so attention matmuls are quantized), exported by
  the dynamo ONNX exporter. torch 2.13 no longer ships ``torch.ao.quantization.quantize_pt2e``; torchao
  is where it lives now.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from pathlib import Path

import onnx
import torch

from .export import INPUT_NAME, IR_VERSION, OUTPUT_NAME


def _finish(path: Path) -> onnx.ModelProto:
    """Readable by onnxruntime 1.31 (IR <= 13), checked, saved."""
    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return model


def brevitas_layerwise(model: torch.nn.Module, calib: Sequence[torch.Tensor]) -> torch.nn.Module:
    """Brevitas layer-wise int8 PTQ of a copy of ``model``, calibrated on ``calib``."""
    from brevitas.graph.calibrate import calibration_mode
    from brevitas.graph.quantize import layerwise_quantize

    qmodel = layerwise_quantize(copy.deepcopy(model).eval()).eval()
    with torch.no_grad(), calibration_mode(qmodel):
        for batch in calib:
            qmodel(batch)
    return qmodel


def brevitas_export(
    qmodel: torch.nn.Module, example: torch.Tensor, path: str | Path, form: str = "qcdq"
) -> onnx.ModelProto:
    """``export_onnx_qcdq`` (form "qcdq") or ``export_qonnx`` (form "qonnx": QONNX ``Quant`` nodes, which
    onnxruntime cannot run) of a Brevitas model, opset 17, dynamic batch."""
    from brevitas.export import export_onnx_qcdq, export_qonnx

    export = {"qcdq": export_onnx_qcdq, "qonnx": export_qonnx}[form]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export(
            qmodel,
            args=example,
            export_path=str(path),
            opset_version=17,
            dynamo=False,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )
    if form == "qonnx":
        model = onnx.load(str(path))
        model.ir_version = min(model.ir_version, IR_VERSION)
        onnx.save(model, str(path))
        return model
    return _finish(Path(path))


def pt2e_x86(model: torch.nn.Module, calib: Sequence[torch.Tensor], path: str | Path) -> onnx.ModelProto:
    """PT2E static int8 PTQ with the X86 Inductor quantizer, exported by the dynamo exporter to ``path``."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    batch = torch.export.Dim("batch")
    example = (calib[0][:2],)
    graph = torch.export.export(model.eval(), example, dynamic_shapes=({0: batch},)).module()
    config = get_default_x86_inductor_quantization_config()
    quantizer = X86InductorQuantizer().set_global(config).set_function_type_qconfig(torch.matmul, config)
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for b in calib:
            prepared(b)
    converted = convert_pt2e(prepared)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            converted,
            example,
            str(path),
            dynamo=True,
            external_data=False,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: batch},),
            verbose=False,
        )
    return _finish(Path(path))
