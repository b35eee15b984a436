"""ONNX export of a ``transformers`` model the way users do it: ``torch.onnx.export`` with the TorchScript
exporter at opset 17, or with the dynamo exporter (torch's default since 2.9) at its default opset.

The model is exported as it is (no wrapper), with keyword inputs named as HF names them, the first output
named ``logits`` and a dynamic batch axis (and sequence axis for BERT), as Optimum's exporter declares them.
Optimum's own exporter runs in an isolated venv (``hf_optimum.py``).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import onnx
import torch

from .hf import VISION, input_names

EXPORTERS = ("torchscript", "dynamo")
TORCHSCRIPT_OPSET = 17
OUTPUT_NAME = "logits"
IR_VERSION = 10  # onnxruntime 1.31 reads IR versions up to 13 (onnx 1.23 writes 14); match models/export.py
#: attention implementations the dynamo exporter needs instead of transformers' default (sdpa): torch 2.13
#: decomposes Swin's SDPA into a tensor that HF's ``reshape`` after it cannot view ("Cannot view a tensor with
#: shape [8, 4, 2, 8] and strides (64, 8, 32, 1) as a tensor with shape (8, 4, 16)"), static shapes too
DYNAMO_ATTENTION = {"swin": "eager"}


def dynamic_axes(family: str) -> dict[str, dict[int, str]]:
    """Batch (and, for BERT, sequence) axes of the inputs and the logits."""
    axes = {0: "batch"} if family in VISION else {0: "batch", 1: "sequence"}
    return {**{k: dict(axes) for k in input_names(family)}, OUTPUT_NAME: {0: "batch"}}


def export(model, family: str, path: str | Path, exporter: str, example: dict) -> onnx.ModelProto:
    """Export ``model`` with ``exporter`` ("torchscript" or "dynamo") on the example feeds (numpy, a batch
    of at least 2); saves with IR version 10 and returns the model."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    names = input_names(family)
    # a copy: tracing mutates HF models (Swin stores a traced window size, which the next export then reads)
    model = copy.deepcopy(model).eval()
    kwargs = {k: torch.from_numpy(example[k]) for k in names}
    common = dict(input_names=list(names), output_names=[OUTPUT_NAME], dynamic_axes=dynamic_axes(family))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TorchScript's deprecation, dynamo's dynamic_axes conversion notes
        if exporter == "torchscript":
            torch.onnx.export(
                model, (), str(path), kwargs=kwargs, dynamo=False, opset_version=TORCHSCRIPT_OPSET, **common
            )
        else:
            if family in DYNAMO_ATTENTION:
                model.set_attn_implementation(DYNAMO_ATTENTION[family])
            torch.onnx.export(
                model, (), str(path), kwargs=kwargs, external_data=False, verbose=False, **common
            )
    m = onnx.load(str(path))
    m.ir_version = min(m.ir_version, IR_VERSION)
    onnx.save(m, str(path))
    return m
