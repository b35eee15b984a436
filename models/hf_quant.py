"""Post-training QDQ quantization of exported ``transformers`` models, as users run it: onnxruntime's
``quantize_static`` and NNCF's ``nncf.quantize`` (Optimum's ``ORTQuantizer`` runs in its own venv,
``hf_optimum.py``), each with its default options and with the options a user picks for transformers.

Every quantizer takes an FP32 ONNX file, calibration batches (feeds: input name -> array) and writes the
fake-quant file (IR version 10). ``ort_bert_recipe`` is the onnxruntime recipe that keeps a text model's
attention mask (BERT's and every other HF encoder's in ``hf.TEXT``) out of the quantized tensors
(``ort_qdq.mask_nodes``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from .ort_qdq import IR_VERSION, ort_quantize

Batches = list[dict[str, np.ndarray]]


def ort(fp32: str | Path, out: str | Path, calib: Batches, variant: str) -> None:
    """onnxruntime ``quantize_static`` (QDQ, min/max) on the export as it is: ``variant`` is a key of
    ``ort_qdq.VARIANTS`` ("default": no options at all; "int8_sym": int8 symmetric per-channel). No
    ``quant_pre_process``: its symbolic shape inference fails on HF's Swin and BERT exports with dynamic
    axes ("Incomplete symbolic shape inference"), and Optimum's quantizer does not run it either."""
    ort_quantize(fp32, out, calib, variant, preprocess=False)


def ort_bert_recipe(fp32: str | Path, out: str | Path, calib: Batches) -> None:
    """The mask recipe (named for BERT, for every text model): int8 symmetric per-channel
    (``ort_qdq.VARIANTS["int8_sym"]``) with the attention mask's nodes excluded
    (``ort_quantize(..., exclude_mask=True)``, ``ort_qdq.mask_nodes``)."""
    ort_quantize(fp32, out, calib, "int8_sym", preprocess=False, exclude_mask=True)


def nncf_ptq(fp32: str | Path, out: str | Path, calib: Batches, transformer: bool) -> None:
    """``nncf.quantize(onnx_model, nncf.Dataset(batches))``: NNCF's default PTQ (8-bit, its default preset,
    fast bias correction), every batch used (``subset_size``); ``transformer``:
    ``model_type=nncf.ModelType.TRANSFORMER`` (NNCF's transformer ignored patterns and SmoothQuant), as
    NNCF documents for transformers."""
    import nncf

    model = onnx.load(str(fp32))
    options = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    quantized = nncf.quantize(model, nncf.Dataset(calib), subset_size=len(calib), **options)
    quantized.ir_version = min(quantized.ir_version, IR_VERSION)
    onnx.save(quantized, str(out))


#: quantizer name -> fn(fp32_path, out_path, calibration batches); Optimum's runs elsewhere (hf_optimum)
QUANTIZERS: dict[str, Callable[[str | Path, str | Path, Batches], object]] = {
    "ort_default": lambda f, o, c: ort(f, o, c, "default"),
    "ort_int8": lambda f, o, c: ort(f, o, c, "int8_sym"),
    "ort_bert_recipe": ort_bert_recipe,
    "nncf_default": lambda f, o, c: nncf_ptq(f, o, c, transformer=False),
    "nncf_transformer": lambda f, o, c: nncf_ptq(f, o, c, transformer=True),
}
